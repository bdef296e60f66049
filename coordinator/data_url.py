"""Base64 data URLs and bare base64 payloads, bounded before anything is decoded.

Shared by the audio and video parts (images keep their own path in media.py): the decoded size is
computed from the base64 length, so an oversized payload is refused without decoding it.
"""

from __future__ import annotations

import base64
import binascii
import re

from coordinator.media import MediaError, base64_decoded_size

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.S)
_SPACE = re.compile(r"\s")


def mb(n: float) -> str:
    return f"{n / 2**20:.3g} MB"


def decode_base64(b64: str, max_bytes: int, what: str, flag: str, param: str | None) -> bytes:
    """Bytes of `b64`, refused (400) when larger than `max_bytes` or not valid base64."""
    b64 = _SPACE.sub("", b64)
    size = base64_decoded_size(b64)
    if size > max_bytes:
        raise MediaError(f"{what} is {mb(size)}; the limit is {mb(max_bytes)} ({flag})", param)
    if not b64:
        raise MediaError(f"{what} is empty", param)
    if len(b64) % 4:
        raise MediaError(f"{what} is not valid base64 (its length is not a multiple of 4)", param)
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"{what} is not valid base64 ({e})", param) from None


def split_data_url(url: str, param: str | None, expected: str) -> tuple[str, str]:
    """(mime type, base64 payload) of a data URL; `expected` says what to send instead."""
    m = _DATA_URL.match(url)
    if m is None:
        raise MediaError(f"{expected} (a data URL must say ';base64,')", param)
    return (m["mime"] or ""), m["data"]
