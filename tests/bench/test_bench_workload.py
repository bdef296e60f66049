"""The arrival process has the requested rate and burstiness; synthetic requests are real, seeded media."""

from __future__ import annotations

import base64
import io
import math
import wave

import numpy as np
import pytest
from PIL import Image

from benchmarks.bench import workload as wl
from benchmarks.bench.media import synthetic_wav

N = 10_000


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 0.5, 2.0, 4.0])
@pytest.mark.parametrize("rate", [0.5, 8.0])
def test_arrivals_have_the_requested_rate_and_cv(rate, burstiness):
    """Over 10,000 gaps: mean gap 1/rate and CV 1/sqrt(burstiness), within 4 standard errors.

    SE of the sample mean is CV/sqrt(n); SE of the sample SD of Gamma(k) gaps is about
    0.5*sqrt((2 + 6/k)/n) relative (6/k is Gamma's excess kurtosis), so CV's relative SE is at most
    the sum of the two."""
    gaps = np.diff(wl.arrival_offsets(wl.unit_gaps(N + 1, burstiness, np.random.default_rng(7)), rate))
    cv = 1 / math.sqrt(burstiness)
    mean_se = cv / math.sqrt(N)
    cv_se = mean_se + 0.5 * math.sqrt((2 + 6 / burstiness) / N)
    assert abs(gaps.mean() * rate - 1) < 4 * mean_se
    assert abs(gaps.std(ddof=1) / gaps.mean() / cv - 1) < 4 * cv_se
    assert abs(N / (gaps.sum() * rate) - 1) < 4 * mean_se  # the realised request rate


def test_poisson_gaps_are_exponential():
    """burstiness 1 is a Poisson process: P(gap > t) = exp(-rate t) at a few quantiles."""
    rate = 3.0
    gaps = np.diff(wl.arrival_offsets(wl.unit_gaps(N + 1, 1.0, np.random.default_rng(1)), rate))
    for t in (0.1, 0.3, 0.7, 1.2):
        p = math.exp(-rate * t)
        assert abs((gaps > t).mean() - p) < 4 * math.sqrt(p * (1 - p) / N)


def test_first_request_at_zero_and_inf_sends_everything_at_once():
    gaps = wl.unit_gaps(5, 1.0, np.random.default_rng(0))
    off = wl.arrival_offsets(gaps, 2.0)
    assert off[0] == 0.0 and np.allclose(np.diff(off), gaps[:-1] / 2.0)
    assert not wl.arrival_offsets(gaps, math.inf).any()
    with pytest.raises(wl.WorkloadError):
        wl.arrival_offsets(gaps, 0.0)
    with pytest.raises(wl.WorkloadError, match="burstiness"):
        wl.unit_gaps(3, 0.0, np.random.default_rng(0))


@pytest.mark.parametrize("text,kind,a,b", [("64", "fixed", 64, 0), ("uniform:16:128", "uniform", 16, 128),
                                           ("normal:64:8", "normal", 64, 8)])
def test_length_specs_parse(text, kind, a, b):
    n = wl.Length.parse(text, "--output-tokens")
    assert (n.kind, n.a, n.b) == (kind, a, b)
    drawn = n.sample(np.random.default_rng(0), 1000)
    assert drawn.min() >= 1 and (kind != "uniform" or drawn.max() <= 128)


@pytest.mark.parametrize("text", ["", "x", "uniform:5", "uniform:9:3", "normal:4", "0", "1.5", "fixed:2:3"])
def test_bad_length_specs_are_refused(text):
    with pytest.raises(wl.WorkloadError, match="--output-tokens"):
        wl.Length.parse(text, "--output-tokens")


def test_synthetic_requests_are_seeded_real_images_of_the_asked_size():
    mix = wl.MixConfig(images_per_request=wl.Length(a=2, floor=0), image_sizes=[(200, 100)])
    a, b = wl.synthesize(3, mix, seed=5), wl.synthesize(3, mix, seed=5)
    assert [x.content for x in a] == [x.content for x in b]
    assert a[0].content != wl.synthesize(3, mix, seed=6)[0].content
    parts = a[0].content
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert len(urls) == 2 and urls[0] != urls[1]  # never the same picture twice (server caches)
    im = Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1])))
    assert im.size == (200, 100) and im.format == "JPEG"
    assert parts[-1]["type"] == "text" and len(parts[-1]["text"].split()) == 32
    assert a[0].meta == {"modality": "image", "prompt_words": 32, "images": 2, "image_sizes": ["200x100"] * 2}


def test_modality_mix_and_audio():
    mix = wl.MixConfig(modalities=wl.parse_modalities("text:1,audio:1"), audio_seconds=0.5)
    specs = wl.synthesize(200, mix, seed=0)
    kinds = [s.meta["modality"] for s in specs]
    assert 70 < kinds.count("audio") < 130 and set(kinds) == {"text", "audio"}
    audio = next(s for s in specs if s.meta["modality"] == "audio").content[0]
    assert audio["type"] == "input_audio" and audio["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(audio["input_audio"]["data"]))) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (1, 16_000, 8_000)
    assert len(synthetic_wav(np.random.default_rng(0), 1.0)) == 44 + 32_000


def test_video_requests_carry_frames_in_qwens_format():
    mix = wl.MixConfig(modalities=wl.parse_modalities("video"), video_frames=3, image_sizes=[(32, 24)])
    part = wl.synthesize(2, mix, seed=0)[0].content[0]
    assert part["type"] == "video" and len(part["video"]) == 3
    assert all(u.startswith("data:image/jpeg;base64,") for u in part["video"])


@pytest.mark.parametrize("text,needle", [("smell", "unknown modality"),
                                         ("image:x", "not a number"), ("image:0", "positive weight")])
def test_bad_modalities_are_refused(text, needle):
    with pytest.raises(wl.WorkloadError, match=needle):
        wl.parse_modalities(text)
