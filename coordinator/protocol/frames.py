"""A video's frames as one Redis value: a count, then each frame's length and bytes.

A video is a list of encoded frames (PNG/JPEG...); storing it under one key keeps one MediaRef per
media item, as for images and audio. The format is explicit and bounded (no pickle): a 4-byte
big-endian frame count, then per frame a 4-byte big-endian length and the frame's bytes.
"""

from __future__ import annotations

import struct

_U32 = struct.Struct(">I")


def pack_frames(frames: list[bytes]) -> bytes:
    return b"".join([_U32.pack(len(frames)), *(_U32.pack(len(f)) + f for f in frames)])


def unpack_frames(blob: bytes) -> list[bytes]:
    """Raise ValueError if `blob` is not exactly a packed list of frames."""
    if len(blob) < 4:
        raise ValueError("video blob is shorter than its frame count")
    (n,), pos, frames = _U32.unpack_from(blob, 0), 4, []
    for i in range(n):
        if pos + 4 > len(blob):
            raise ValueError(f"video blob ends before frame {i} of {n}")
        (size,) = _U32.unpack_from(blob, pos)
        pos += 4
        if pos + size > len(blob):
            raise ValueError(f"video blob ends inside frame {i} of {n}")
        frames.append(blob[pos : pos + size])
        pos += size
    if pos != len(blob):
        raise ValueError(f"video blob has {len(blob) - pos} bytes after its {n} frames")
    return frames
