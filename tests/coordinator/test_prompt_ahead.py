"""Which requests send their encode job before their prompt is built (coordinator/prompt_ahead.py): image data URLs
whose headers pass the limits, small enough to ride in the job, with short text; everything else is built first."""

from __future__ import annotations

import pytest
from media_factory import data_url, image_bytes

from coordinator.api.schema import ChatCompletionRequest
from coordinator.media import MediaLimits
from coordinator.prompt import PromptBuilder
from coordinator.prompt_ahead import AHEAD_MAX_CHARS, media_ahead
from coordinator.protocol.messages import INLINE_MEDIA_MAX_BYTES
from coordinator.protocol.models import DEFAULT_MODEL_DIR, QWEN2_AUDIO_DIR


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder.from_model_dir(DEFAULT_MODEL_DIR, MediaLimits(max_image_bytes=2 << 20))


def _req(*parts: dict, text: str = "what is this?") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "tiny-llava", "max_tokens": 4, "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": text}]}]})


def _image(raw: bytes, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(raw, mime)}}


def test_images_go_ahead_with_the_tokens_the_build_counts(builder):
    raws = [image_bytes(1, 64, 48), image_bytes(2, 300, 200, fmt="JPEG")]
    req = _req(_image(raws[0]), _image(raws[1], "image/jpeg"))
    ahead = media_ahead(builder, req)
    built = builder.build(req)
    assert ahead is not None
    assert ahead.media == [("image", raws[0]), ("image", raws[1])] == [(m.modality, m.data) for m in built.media]
    assert ahead.tokens == [m.num_tokens for m in built.media]


def test_a_corrupt_body_behind_a_good_header_goes_ahead_and_the_build_refuses_it(builder):
    whole = image_bytes(3, 200, 200, fmt="JPEG")
    req = _req(_image(whole[: len(whole) // 2], "image/jpeg"))
    assert media_ahead(builder, req) is not None  # only the header is read before the job leaves
    with pytest.raises(Exception, match="corrupt"):
        builder.build(req)


@pytest.mark.parametrize("case", ["text only", "local path", "not an image", "too many pixels", "too many images",
                                  "long text", "too big to ride in the job"])
def test_everything_else_is_built_first(builder, case, monkeypatch):
    import coordinator.prompt_ahead as ahead

    decoded = []
    real = ahead.image_data_url_bytes
    monkeypatch.setattr(ahead, "image_data_url_bytes", lambda *a: decoded.append(1) or real(*a))
    small = _image(image_bytes(4, 32, 32))
    req = {
        "text only": lambda: _req(),
        "local path": lambda: _req({"type": "image_url", "image_url": {"url": "/tmp/some.png"}}),
        "not an image": lambda: _req(_image(b"hello, I am text")),
        "too many pixels": lambda: _req(_image(image_bytes(None, 5000, 5000))),
        "too many images": lambda: _req(*[small] * (builder.limits.max_images_per_request + 1)),
        "long text": lambda: _req(small, text="w" * (AHEAD_MAX_CHARS + 1)),
        "too big to ride in the job": lambda: _req(_image(image_bytes(5, 600, 600))),
    }[case]()
    if case == "too big to ride in the job":
        raw = req.messages[0].content[0].image_url.url
        assert len(raw) * 3 // 4 > INLINE_MEDIA_MAX_BYTES
    assert media_ahead(builder, req) is None
    if case in ("too many images", "long text", "too big to ride in the job"):
        assert decoded == []  # refused from the parts' count and length, before any decoding (the event loop's time)


def test_a_model_without_images_builds_first():
    audio = PromptBuilder.from_model_dir(QWEN2_AUDIO_DIR)
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": [
        _image(image_bytes(6, 32, 32)), {"type": "text", "text": "hi"}]}]})
    assert media_ahead(audio, req) is None


def test_it_is_off_unless_the_coordinator_is_asked():
    import argparse

    from coordinator.serve import add_coordinator_args, config_from_args

    p = argparse.ArgumentParser()
    add_coordinator_args(p)
    off = config_from_args(p.parse_args([]), "redis://127.0.0.1:6379/0")
    on = config_from_args(p.parse_args(["--prompt-ahead"]), "redis://127.0.0.1:6379/0")
    assert (off.prompt_ahead, on.prompt_ahead) == (False, True)
