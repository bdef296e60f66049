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


def repeated_gif(frames: int, h: int = 256, w: int = 256, seed: int = 0) -> bytes:
    """An animated GIF of `frames` copies of one solid-colour frame, made by repeating the frame's blocks:
    PIL's encoder takes ~5 ms a frame, this takes none, so a hostile many-frame file is cheap to make.
    A solid 256x256 frame is ~440 bytes, so such a file decodes to far more pixels than its size suggests."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), rng.integers(0, 256, 3), np.uint8)).save(buf, format="GIF")
    raw = buf.getvalue()
    start = gif_first_block(raw)
    return raw[:start] + raw[start:-1] * frames + b";"  # the last byte is the trailer, b";"


def gif_first_block(raw: bytes) -> int:
    """Offset of the first block after a GIF's header, logical screen descriptor and global colour table."""
    flags = raw[10]
    return 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)


def float_wav_bytes(samples, rate: int = 16000, bits: int = 32) -> bytes:
    """An IEEE-float WAV (format code 3; stdlib `wave` writes only PCM) of `samples` exactly as given,
    NaN, infinities and values far outside [-1, 1] included."""
    import struct

    data = np.asarray(samples, dtype="<f4" if bits == 32 else "<f8").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * bits // 8, bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


MP3_FRAME_SAMPLES, MP3_8K_FRAME_BYTES = 576, 72
"""MPEG-2.5 layer III at 8 kHz and 8 kbit/s: 576 samples in a 72-byte frame (72 * bitrate / rate)."""


def long_mp3(seconds: float, seed: int = 0) -> bytes:
    """A constant-bitrate 8 kHz, 8 kbit/s MP3 of about `seconds` (1 kB a second, so a 16 MB file is 4.5 hours).

    Ten seconds are encoded once and their frames repeated; the first frame (a Xing/Info frame giving the
    ten seconds' frame count) is dropped, so a reader takes the length from the file size and bitrate."""
    import soundfile

    rate = 8000
    t = np.arange(10 * rate) / rate
    tone = (0.3 * np.sin(2 * np.pi * (220 + 220 * np.random.default_rng(seed).random()) * t)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, tone, rate, format="MP3", compression_level=0.99, bitrate_mode="CONSTANT")
    frames = buf.getvalue()[MP3_8K_FRAME_BYTES:]
    assert len(frames) % MP3_8K_FRAME_BYTES == 0, "not 72-byte frames: the encoder's settings changed"
    per_copy = len(frames) // MP3_8K_FRAME_BYTES * MP3_FRAME_SAMPLES / rate
    return frames * max(1, round(seconds / per_copy))
