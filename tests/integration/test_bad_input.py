"""Bad input gets a 4xx with a reason, and the coordinator keeps serving afterwards."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import numpy as np
import pytest
from cluster_factory import serve_cluster
from media_factory import data_url, float_wav_bytes, image_bytes, long_mp3, repeated_gif, wav_bytes
from mm_refs import pcm

from coordinator.protocol.models import QWEN2_AUDIO_DIR, QWEN2_VL_DIR

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


# --- hostile input: refused from its headers, while a normal request beside it is answered -------------

HOSTILE_S = 5.0
"""Bound on answering a hostile request, upload included; decoding what each one asks for takes longer
(the GIF below: ~11 s; tokenizing 2 M characters: ~4.5 s; the MP3: ~4 s) on an idle 2-core machine."""


@pytest.fixture(scope="module")
def mm_cluster(request, redis_url, tmp_path_factory):
    """One encode worker and one combined LLM worker serving the checkpoint dir the test names (indirect)."""
    yield from serve_cluster(tmp_path_factory.mktemp(f"logs-hostile-{request.param.name}"), encode_workers=1,
                             llm_roles=["combined"], model_dir=request.param, redis_url=redis_url)


vl_cluster = pytest.mark.parametrize("mm_cluster", [QWEN2_VL_DIR], indirect=True, ids=["qwen2-vl"])
audio_cluster = pytest.mark.parametrize("mm_cluster", [QWEN2_AUDIO_DIR], indirect=True, ids=["qwen2-audio"])


def _user(cluster, *parts: dict) -> dict:
    return {"model": cluster.spec.model_name, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "what is this?"}]}]}


def _audio_part(raw: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(raw).decode(), "format": fmt}}


def _beside_a_normal_request(cluster, hostile: dict, normal: dict, status: int, *needles: str) -> None:
    """Send both at once: the hostile one is refused with `status` and a reason within HOSTILE_S, the normal
    one is answered 200."""
    body = json.dumps(hostile).encode()  # serialized beforehand, so the clock measures the server

    async def both():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
            async def send_hostile():
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", content=body,
                                      headers={"content-type": "application/json"})
                return r, time.perf_counter() - t0

            return await asyncio.gather(send_hostile(), client.post("/v1/chat/completions", json=normal))

    (bad, seconds), ok = asyncio.run(both())
    _error(bad, status, *needles)
    assert seconds < HOSTILE_S, f"the hostile request took {seconds:.1f} s to refuse"
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] > 0


def test_huge_text_is_refused_before_tokenizing(cluster):
    hostile = {"model": "tiny-llava", "max_tokens": 2, "messages": [{"role": "user", "content": "word " * 400_000}]}
    _beside_a_normal_request(cluster, hostile, _body(data_url(_png()), temperature=0), 413,
                             "2,000,000 characters", "--max-prompt-chars")


def test_animated_image_url_is_read_from_its_first_frame(cluster):
    gif = repeated_gif(600)  # 600 frames of 256x256 in 270 kB: under the cluster's --max-image-bytes
    r = _post(cluster, json=_body(data_url(gif, "image/gif"), temperature=0))
    assert r.status_code == 200, r.text


@vl_cluster
def test_gif_with_thousands_of_frames_is_refused_before_decoding(mm_cluster):
    gif = repeated_gif(4000, 1024, 1024)  # 7.6 MB; 4 G pixels to decode
    hostile = _user(mm_cluster, {"type": "video_url", "video_url": {"url": data_url(gif, "image/gif")}})
    normal = _user(mm_cluster, {"type": "image_url", "image_url": {"url": data_url(image_bytes(1, 64, 64))}})
    _beside_a_normal_request(mm_cluster, hostile, normal, 400, "more than 256 frames", "--max-video-frames")


@audio_cluster
def test_hours_long_mp3_is_refused_from_its_header(mm_cluster):
    hostile = _user(mm_cluster, _audio_part(long_mp3(16_000), "mp3"))  # 16 MB: 4.4 hours
    normal = _user(mm_cluster, _audio_part(wav_bytes(pcm(1, 1.0))))
    _beside_a_normal_request(mm_cluster, hostile, normal, 400, "15996.96 s", "the limit is")


@audio_cluster
@pytest.mark.parametrize("value,needle", [(1e30, "reach 1e+30"), (float("nan"), "NaN or infinite")])
def test_float_audio_with_huge_or_non_finite_samples(mm_cluster, value, needle):
    samples = np.zeros(16000)
    samples[::100] = value
    hostile = _user(mm_cluster, _audio_part(float_wav_bytes(samples)))
    normal = _user(mm_cluster, _audio_part(wav_bytes(pcm(2, 1.0))))
    _beside_a_normal_request(mm_cluster, hostile, normal, 400, needle, "[-1, 1]")
