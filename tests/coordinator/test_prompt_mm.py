"""PromptBuilder for Qwen2-VL (image, video) and Qwen2-Audio: the ids the model's processor would make,
the media the encoder gets, and bad media refused with a 4xx that says why."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from media_factory import data_url, gif_bytes, image_bytes, wav_bytes
from mm_refs import pcm

from coordinator.api.schema import ChatCompletionRequest
from coordinator.audio import decode_wav, resample
from coordinator.errors import RequestError
from coordinator.media import MediaLimits
from coordinator.prompt import PromptBuilder
from coordinator.protocol.frames import unpack_frames
from coordinator.protocol.models import DEFAULT_MODEL_DIR, QWEN2_AUDIO_DIR, QWEN2_VL_DIR


@pytest.fixture(scope="module")
def vl() -> PromptBuilder:
    return PromptBuilder.from_model_dir(QWEN2_VL_DIR, MediaLimits(max_video_frames=8))


@pytest.fixture(scope="module")
def audio() -> PromptBuilder:
    return PromptBuilder.from_model_dir(QWEN2_AUDIO_DIR, MediaLimits(max_audio_seconds=3.0))


def req(*parts: dict, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": list(parts)}],
                                                 **fields})


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def image(raw: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(raw)}}


def frames(*raws: bytes) -> dict:
    return {"type": "video", "video": [data_url(r) for r in raws]}


def wav(raw: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(raw).decode(), "format": fmt}}


def error(builder: PromptBuilder, *parts: dict) -> RequestError:
    with pytest.raises(RequestError) as e:
        builder.build(req(*parts))
    assert 400 <= e.value.status < 500
    return e.value


def test_qwen2_vl_image_ids_match_the_processors_expansion(vl):
    ip, tok = vl.view.image_processor, vl.tokenizer
    built = vl.build(req(image(image_bytes(1, 300, 200)), text("describe")))
    n = ip.get_number_of_image_patches(300, 200, {}) // 4
    want = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, text("describe")]}],
                                   add_generation_prompt=True, tokenize=False).replace("<|image_pad|>", "<|image_pad|>" * n)
    assert built.prompt_token_ids == tok(want)["input_ids"]
    assert [(m.modality, m.num_tokens) for m in built.media] == [("image", n)] and n == 28


def test_qwen2_vl_video_frames_are_packed_and_counted(vl):
    raws = [image_bytes(i, 120, 160) for i in range(3)]
    built = vl.build(req(frames(*raws), text("what happens")))
    (item,) = built.media
    assert item.modality == "video" and unpack_frames(item.data) == raws
    assert item.num_tokens == 2 * (8 * 12) // 4  # 2 temporal groups of a 112x168 frame's 8x12 patches
    assert built.prompt_token_ids.count(vl.tokenizer.convert_tokens_to_ids("<|video_pad|>")) == item.num_tokens


def test_an_animated_gif_is_a_video(vl):
    url = data_url(gif_bytes(1, 5), "image/gif")
    built = vl.build(req({"type": "video_url", "video_url": {"url": url}}, text("what happens")))
    assert len(unpack_frames(built.media[0].data)) == 5


def test_a_long_animation_is_sampled_down_to_the_frame_limit(vl):
    url = data_url(gif_bytes(2, 20), "image/gif")
    built = vl.build(req({"type": "video_url", "video_url": {"url": url}}))
    assert len(unpack_frames(built.media[0].data)) == 8


@pytest.mark.parametrize("rate,channels,bits", [(16000, 1, 16), (44100, 2, 16), (8000, 1, 8), (22050, 1, 32)])
def test_qwen2_audio_ids_match_the_processor(audio, rate, channels, bits):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(QWEN2_AUDIO_DIR)
    raw = wav_bytes(pcm(1, 1.3, rate), rate, channels, bits)
    built = audio.build(req(wav(raw), text("what is this sound")))
    clip = np.frombuffer(built.media[0].data, "<f4")
    x, r = decode_wav(raw)
    assert r == rate and np.allclose(clip, resample(x, rate, 16000))
    assert len(clip) == round(len(x) * 16000 / rate)
    prompt = processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}, text("what is this sound")]}],
                                           add_generation_prompt=True, tokenize=False)
    want = processor(text=prompt, audio=[clip], sampling_rate=16000)["input_ids"][0]
    assert built.prompt_token_ids == list(want)


def test_resampling_keeps_a_tone_in_band():
    t = np.arange(44100) / 44100
    y = resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), 44100, 16000)
    spectrum = np.abs(np.fft.rfft(y))
    assert len(y) == 16000 and abs(int(np.argmax(spectrum)) - 440) <= 1


# --- bad media ----------------------------------------------------------------------------------------

def test_truncated_image(vl):
    raw = image_bytes(3, 64, 64, "JPEG")
    assert "corrupt" in error(vl, image(raw[: len(raw) // 3])).message


def test_wrong_audio_format(audio):
    err = error(audio, wav(image_bytes(1, 8, 8)))
    assert "not a WAV file" in err.message and err.param == "messages[0].content[0].input_audio.data"


def test_truncated_wav(audio):
    raw = wav_bytes(pcm(1, 1.0))
    assert "truncated" in error(audio, wav(raw[: len(raw) // 2])).message


def test_mp3_without_a_decoder_or_with_bad_data(audio):
    message = error(audio, wav(b"\xff\xfb\x90\x00" + bytes(200), "mp3")).message
    assert "mp3" in message.lower()


def test_too_long_a_clip(audio):
    err = error(audio, wav(wav_bytes(pcm(1, 3.5))))
    assert "3.50 s; the limit is 3 s" in err.message


def test_the_models_window_caps_the_clip_length():
    builder = PromptBuilder.from_model_dir(QWEN2_AUDIO_DIR)  # 30 s allowed, the tiny encoder's window is 5 s
    assert "the limit is 5 s" in error(builder, wav(wav_bytes(pcm(1, 5.5)))).message


def test_too_short_a_clip(audio):
    assert "at least" in error(audio, wav(wav_bytes(pcm(1, 0.01)))).message


def test_too_many_frames(vl):
    err = error(vl, frames(*[image_bytes(i, 32, 32) for i in range(9)]))
    assert "9 frames; the limit is 8 (--max-video-frames)" in err.message


def test_frames_of_different_sizes(vl):
    assert "differ in size" in error(vl, frames(image_bytes(1, 32, 32), image_bytes(2, 32, 48))).message


def test_a_video_file_without_a_decoder(vl):
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    assert "video/mp4" in error(vl, part).message


def test_one_modality_per_request(vl):
    err = error(vl, image(image_bytes(1, 32, 32)), frames(image_bytes(2, 32, 32)))
    assert "mixes image and video" in err.message


def test_modalities_the_model_lacks(vl, audio):
    assert error(vl, wav(wav_bytes(pcm(1, 1.0)))).message.startswith("audio encoder not configured")
    assert "it takes audio input" in error(audio, image(image_bytes(1, 32, 32))).message
    llava = PromptBuilder.from_model_dir(DEFAULT_MODEL_DIR)
    assert "send the frames as image_url parts" in error(llava, frames(image_bytes(1, 32, 32))).message


def test_placeholders_in_text_are_refused(vl, audio):
    assert "<|video_pad|>" in error(vl, text("a <|video_pad|> b")).message
    assert "<|AUDIO|>" in error(audio, text("<|AUDIO|>")).message


def test_mp3_decodes_to_the_same_clip():
    import io

    import soundfile

    from coordinator.audio import decode_mp3

    clip = pcm(2, 1.0)
    buf = io.BytesIO()
    soundfile.write(buf, clip, 16000, format="MP3")
    x, rate = decode_mp3(buf.getvalue())
    assert rate == 16000 and abs(len(x) - len(clip)) <= 1152  # MP3 frames pad the end
    n = min(len(x), len(clip))
    # Lossy: the tones survive (correlation), the exact samples do not.
    assert np.corrcoef(x[:n], clip[:n])[0, 1] > 0.9


def test_mp3_request_becomes_audio_tokens(audio):
    import io

    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, pcm(3, 1.0), 16000, format="MP3")
    prompt = audio.build(req(wav(buf.getvalue(), "mp3"), text("what is this?")))
    assert prompt.media and prompt.media[0].modality == "audio"
