"""Synthetic media for benchmark requests: real encoded images (PIL) and real WAV audio, made here.

Every request gets its own picture (random background, shapes and colours drawn from the workload's
seeded generator), never one reused image: servers that cache encoder outputs by content (vLLM's
multimodal cache) would otherwise skip the very work being measured. Pictures are smooth shapes rather
than pixel noise so they compress like photographs do (tens of KB as JPEG), not like noise.
"""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from PIL import Image, ImageDraw


def data_url(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def _colour(rng: np.random.Generator) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in rng.integers(0, 256, 3))
    return r, g, b


def synthetic_image(rng: np.random.Generator, width: int, height: int, fmt: str = "JPEG") -> bytes:
    """A `width` x `height` picture: a vertical gradient, 3-8 ellipses and rectangles, a little grain."""
    top, bottom = np.array(_colour(rng), np.float32), np.array(_colour(rng), np.float32)
    t = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    arr = (top * (1 - t) + bottom * t).repeat(width, axis=1)
    arr += rng.normal(0.0, 4.0, arr.shape).astype(np.float32)
    im = Image.fromarray(arr.clip(0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, width, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, height, 2))
        box = (x0, y0, max(x1, x0 + 2), max(y1, y0 + 2))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=_colour(rng))
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def synthetic_wav(rng: np.random.Generator, seconds: float, sample_rate: int = 16_000) -> bytes:
    """Mono 16-bit PCM WAV: a few tones with random pitch and onsets plus soft noise, speech-like in
    spectrum range (100 Hz - 4 kHz) so an audio encoder sees non-trivial input. A model without
    an audio encoder (e.g. tiny-llava) answers these with a 4xx, counted per error type."""
    n = max(1, int(seconds * sample_rate))
    t = np.arange(n, dtype=np.float64) / sample_rate
    signal = rng.normal(0.0, 0.02, n)
    for _ in range(int(rng.integers(2, 6))):
        freq, start = rng.uniform(100.0, 4000.0), rng.uniform(0.0, seconds)
        envelope = np.exp(-np.clip(t - start, 0.0, None) * rng.uniform(1.0, 6.0)) * (t >= start)
        signal += rng.uniform(0.1, 0.4) * envelope * np.sin(2 * np.pi * freq * t)
    pcm = (np.clip(signal, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()
