"""Bad input gets a 4xx with a reason, and the coordinator keeps serving afterwards."""

from __future__ import annotations

import base64

import httpx
import pytest
from media_factory import data_url, image_bytes

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _png(h: int = 64, w: int = 64, noise: bool = False) -> bytes:
    return image_bytes(0 if noise else None, h, w)


def _body(*urls: str, text: str = "hi", **extra) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]
    return {"model": "tiny-llava", "messages": [{"role": "user", "content": parts}], "max_tokens": 4, **extra}


def _post(cluster, **kw) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/chat/completions", timeout=30, **kw)


def _error(r: httpx.Response, status: int, *needles: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    for n in needles:
        assert n in err["message"], err
    return err


def test_invalid_json(cluster):
    _error(_post(cluster, content=b"{not json", headers={"content-type": "application/json"}), 400, "not valid JSON")


def test_unknown_model(cluster):
    err = _error(_post(cluster, json={**_body(data_url(_png())), "model": "gpt-9"}), 404, "gpt-9", "tiny-llava")
    assert err["param"] == "model"


def test_data_url_that_is_not_an_image(cluster):
    err = _error(_post(cluster, json=_body(data_url(b"hello, I am text", "image/png"))), 400, "image")
    assert "image_url" in (err["param"] or "")


def test_image_over_size_limit(cluster, max_image_bytes):
    big = _png(400, 400, noise=True)
    assert len(big) > max_image_bytes
    _error(_post(cluster, json=_body(data_url(big))), 400, "limit")


def test_too_many_images(cluster):
    url = data_url(_png())
    _error(_post(cluster, json=_body(*[url] * 5)), 400, "5 images", "limit is 4")


def test_empty_messages(cluster):
    _error(_post(cluster, json={"model": "tiny-llava", "messages": [], "max_tokens": 4}), 400, "messages")


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_non_positive_max_tokens(cluster, max_tokens):
    err = _error(_post(cluster, json=_body(data_url(_png()), max_tokens=max_tokens)), 400, "max_tokens")
    assert err["param"] == "max_tokens"


def test_audio_not_configured(cluster):
    body = {"model": "tiny-llava", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF....").decode(), "format": "wav"}}]}]}
    _error(_post(cluster, json=body), 400, "audio encoder not configured")


def test_still_serving_after_bad_input(cluster):
    for _ in range(3):
        _post(cluster, content=b"[]", headers={"content-type": "application/json"})
    r = _post(cluster, json=_body(data_url(_png(), "image/png"), temperature=0))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_body_over_the_limit_is_refused_before_reading_it(cluster, max_image_bytes):
    limit = 4 * (max_image_bytes * 4 // 3 + 4) + (1 << 20)  # 4 images base64-encoded + 1 MiB of text
    body = b'{"model": "tiny-llava", "messages": [], "pad": "' + b"x" * limit + b'"}'
    _error(_post(cluster, content=body, headers={"content-type": "application/json"}), 413, "limit")


def test_too_many_stop_strings(cluster):
    err = _error(_post(cluster, json=_body(data_url(_png()), stop=["a", "b", "c", "d", "e"])), 400, "at most 4")
    assert err["param"] == "stop"


def test_integer_too_long_to_parse(cluster):
    raw = b'{"model": "tiny-llava", "seed": ' + b"9" * 5000 + b', "messages": [{"role": "user", "content": "hi"}]}'
    _error(_post(cluster, content=raw, headers={"content-type": "application/json"}), 400, "not valid JSON")


def test_placeholder_spelled_across_text_parts(cluster):
    body = {"model": "tiny-llava", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<ima"}, {"type": "text", "text": "ge> hi"}]}]}
    _error(_post(cluster, json=body), 400, "placeholder")


def test_nul_byte_in_a_local_path(cluster, media_dir):
    _error(_post(cluster, json=_body(f"file://{media_dir}/a%00b.png")), 400)
    _error(_post(cluster, json=_body(f"{media_dir}/a\x00b.png")), 400)
