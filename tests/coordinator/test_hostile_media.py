"""Hostile media are refused from their headers, before the costly decode they ask for.

Measured on a 2-core machine: decoding every frame of the 20,000-frame GIF below takes ~3 s (refusing it
~0.05 s, mostly its base64), decoding the 4.4-hour MP3 ~2 s and 0.5 GB (refusing it ~0.2 ms). Each test's
time bound sits far below the decode and far above the refusal, for a loaded machine.
"""

from __future__ import annotations

import io
import struct
import time

import numpy as np
import pytest
from media_factory import data_url, float_wav_bytes, gif_bytes, gif_first_block, long_mp3, repeated_gif
from PIL import Image

from coordinator.audio import MAX_ABS_SAMPLE, load_audio
from coordinator.media import MediaError, MediaLimits, load_image
from coordinator.video import ANIMATION_FRAMES_PER_KEPT, gif_frames_and_canvas, load_video_url

P = "messages[0].content[0].video_url.url"
A = "messages[0].content[0].input_audio.data"


def video_error(raw: bytes, limits: MediaLimits, mime: str = "image/gif") -> tuple[MediaError, float]:
    t0 = time.perf_counter()
    with pytest.raises(MediaError) as e:
        load_video_url(data_url(raw, mime), limits, P)
    assert e.value.status == 400 and e.value.param == P
    return e.value, time.perf_counter() - t0


# --- animations ------------------------------------------------------------------------------------


def test_a_gif_of_thousands_of_frames_is_refused_before_decoding():
    raw = repeated_gif(20_000)  # 8.7 MB, 1.3 G pixels to decode
    err, seconds = video_error(raw, MediaLimits())
    most = ANIMATION_FRAMES_PER_KEPT * 32
    assert f"more than {most} frames" in err.message and "--max-video-frames" in err.message
    assert "send a shorter animation" in err.message
    assert seconds < 1.0, f"refusing took {seconds:.2f} s; decoding every frame takes ~3 s"


def test_an_animation_within_the_frame_cap_is_sampled_down():
    limits = MediaLimits(max_video_frames=8)
    video = load_video_url(data_url(repeated_gif(ANIMATION_FRAMES_PER_KEPT * 8, 32, 32), "image/gif"), limits, P)
    assert len(video.frames) == 8 and (video.width, video.height) == (32, 32)
    video_error(repeated_gif(ANIMATION_FRAMES_PER_KEPT * 8 + 1, 32, 32), limits)


@pytest.mark.parametrize("frames", [1, 5, 20])
def test_the_frame_count_matches_pil(frames):
    raw = gif_bytes(1, frames)
    assert gif_frames_and_canvas(raw, 1000) == (Image.open(io.BytesIO(raw)).n_frames, 64, 48)


def test_counting_stops_past_the_cap():
    raw = repeated_gif(1_000_000, 1, 1)  # 17 MB: PIL's n_frames walks all of it (~0.9 s)
    t0 = time.perf_counter()
    assert gif_frames_and_canvas(raw, 256)[0] == 257
    assert time.perf_counter() - t0 < 0.1


def test_a_later_frame_that_grows_the_canvas_is_counted():
    raw = bytearray(repeated_gif(3, 256, 256))
    start = gif_first_block(raw)
    block = (len(raw) - start - 1) // 3  # each frame's blocks, repeated; then the trailer
    second = start + block + raw.index(b",", start) - start  # that frame's image descriptor
    struct.pack_into("<H", raw, second + 1, 5000)  # x offset: PIL would grow the image to 5256 wide
    assert gif_frames_and_canvas(bytes(raw), 100) == (3, 5256, 256)
    err, _ = video_error(bytes(raw), MediaLimits(max_image_pixels=1_000_000))
    assert "5256x256" in err.message and "--max-image-pixels" in err.message


def test_frames_times_pixels_over_the_budget():
    limits = MediaLimits(max_video_frames=8, max_image_pixels=512 * 512)  # budget: 8 frames of 512x512
    err, _ = video_error(repeated_gif(40, 512, 512), limits)
    assert "40 frames of 512x512" in err.message and "(--max-video-frames x --max-image-pixels)" in err.message


def test_a_webp_with_too_many_frames():
    ims = [Image.new("RGB", (32, 32), (i, 0, 0)) for i in range(ANIMATION_FRAMES_PER_KEPT * 2 + 1)]
    buf = io.BytesIO()
    ims[0].save(buf, format="WEBP", save_all=True, append_images=ims[1:], lossless=True)
    err, _ = video_error(buf.getvalue(), MediaLimits(max_video_frames=2), "image/webp")
    assert f"more than {ANIMATION_FRAMES_PER_KEPT * 2} frames" in err.message


def test_an_image_url_decodes_only_the_first_frame():
    raw = gif_bytes(1, 3)
    cut = raw[: len(raw) - 1000]  # the third frame's pixel data is cut short
    assert load_image(data_url(cut, "image/gif"), MediaLimits()).format == "GIF"
    assert "corrupt" in video_error(cut, MediaLimits())[0].message  # as a video every frame is decoded
    many = repeated_gif(15_000)  # 6.6 MB, ~2.5 s to decode every frame
    t0 = time.perf_counter()
    assert load_image(data_url(many, "image/gif"), MediaLimits()).width == 256
    assert time.perf_counter() - t0 < 1.0


def test_the_kept_frames_are_the_animations_own():
    raw = gif_bytes(4, 6)
    video = load_video_url(data_url(raw, "image/gif"), MediaLimits(max_video_frames=3), P)
    with Image.open(io.BytesIO(raw)) as im:
        want = []
        for i in (0, 2, 4):
            im.seek(i)
            want.append(np.asarray(im.convert("RGB")))
    got = [np.asarray(Image.open(io.BytesIO(f))) for f in video.frames]
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))


# --- audio -----------------------------------------------------------------------------------------


def audio_error(raw: bytes, fmt: str = "wav", max_seconds: float = 30.0) -> tuple[MediaError, float]:
    t0 = time.perf_counter()
    with pytest.raises(MediaError) as e:
        load_audio(raw, fmt, 16000, max_seconds, 0.1, A)
    assert e.value.status == 400 and e.value.param == A
    return e.value, time.perf_counter() - t0


def test_a_long_mp3_is_refused_from_its_header():
    raw = long_mp3(16_000)  # 16 MB: 4.4 hours, 128 M samples
    err, seconds = audio_error(raw, "mp3")
    assert "audio clip is 15996.96 s; the limit is 30 s" in err.message and "--max-audio-seconds" in err.message
    assert "cut the clip" in err.message
    assert seconds < 1.0, f"refusing took {seconds:.2f} s; decoding the clip takes ~2 s"


def test_an_mp3_within_the_limit_is_decoded():
    clip = load_audio(long_mp3(20), "mp3", 16000, 30.0, 0.1, A)
    assert abs(clip.seconds - 20.16) < 0.01


@pytest.mark.parametrize("value,bits", [(1e30, 32), (32767.0, 32), (-5.0, 32), (1e300, 64)])
def test_float_samples_far_outside_full_scale(value, bits):
    samples = np.zeros(16000)
    samples[100] = value
    err, _ = audio_error(float_wav_bytes(samples, bits=bits))
    assert f"reach {abs(value):.3g}" in err.message and f"within +-{MAX_ABS_SAMPLE:g}" in err.message
    assert "scale the clip to [-1, 1]" in err.message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_samples(value):
    samples = np.zeros(16000)
    samples[-1] = value
    err, _ = audio_error(float_wav_bytes(samples))
    assert "NaN or infinite" in err.message and "send finite samples" in err.message


def test_a_float_clip_that_overshoots_full_scale_a_little_is_kept():
    t = np.arange(16000) / 16000
    clip = load_audio(float_wav_bytes(1.5 * np.sin(2 * np.pi * 440 * t)), "wav", 16000, 30.0, 0.1, A)
    assert clip.samples == 16000 and np.isfinite(np.frombuffer(clip.pcm, "<f4")).all()


def test_a_long_wav_is_refused_from_its_header():
    err, _ = audio_error(float_wav_bytes(np.zeros(16000 * 31)))
    assert "audio clip is 31.00 s; the limit is 30 s" in err.message
