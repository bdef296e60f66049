"""Test images made here (no downloads): seeded noise or a solid colour, in any PIL format."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def image_bytes(seed: int | None = 0, h: int = 64, w: int = 64, fmt: str = "PNG") -> bytes:
    """Seeded random pixels; seed=None gives an all-black image (compresses to almost nothing)."""
    arr = (np.zeros((h, w, 3), np.uint8) if seed is None
           else np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def wav_bytes(samples, rate: int = 16000, channels: int = 1, bits: int = 16) -> bytes:
    """A PCM WAV file (stdlib `wave`) of float samples in [-1, 1], repeated on every channel."""
    import wave

    x = np.clip(np.asarray(samples, dtype=np.float64), -1, 1)
    if bits == 16:
        data = (x * 32767).astype("<i2")
    elif bits == 32:
        data = (x * (2**31 - 1)).astype("<i4")
    else:
        data = ((x + 1) * 127.5).astype(np.uint8)
    data = np.repeat(data[:, None], channels, axis=1)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(bits // 8)
        w.setframerate(rate)
        w.writeframes(data.tobytes())
    return buf.getvalue()


def gif_bytes(seed: int, frames: int, h: int = 48, w: int = 64) -> bytes:
    """An animated GIF of seeded noise frames."""
    rng = np.random.default_rng(seed)
    ims = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(frames)]
    buf = io.BytesIO()
    ims[0].save(buf, format="GIF", save_all=True, append_images=ims[1:], duration=100, loop=0)
    return buf.getvalue()
