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
