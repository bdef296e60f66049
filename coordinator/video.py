"""Turn a video content part into checked frames (encoded images) before anything is queued.

Two request formats are accepted (see coordinator/api/schema.py's VideoPart):
- `{"type": "video", "video": [<image URL>, ...]}`: the frames, already sampled by the client (the
  Qwen / qwen-vl-utils message format); each URL is a data URL or an allowed local path, like image_url.
- `{"type": "video_url", "video_url": {"url": ...}}` (vLLM's format) naming an animated GIF or WebP,
  as a data URL or an allowed local path: PIL decodes it (no video library needed); when it has more
  frames than --max-video-frames, that many are sampled uniformly. Its frames are counted from the
  file's block headers first, and one with too many frames or pixels to decode is refused before any
  frame is decoded. MP4/WebM need a video decoder this server does not ship, and are refused with a
  4xx saying what to send instead.

A list with too many frames is refused rather than sampled: the client chose those frames.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass

from PIL import Image

from coordinator.data_url import decode_base64, split_data_url
from coordinator.media import MediaError, MediaLimits, check_image_bytes, load_image

ANIMATED = ("GIF", "WEBP")


@dataclass(frozen=True)
class VideoInput:
    frames: list[bytes]
    """Encoded frames (as sent, or PNG for frames taken from an animation), all width x height."""
    width: int
    height: int


def _check_frames(frames: list[bytes], limits: MediaLimits, param: str | None) -> VideoInput:
    if not frames:
        raise MediaError("video has no frames; send at least one", param)
    if len(frames) > limits.max_video_frames:
        raise MediaError(f"video has {len(frames)} frames; the limit is {limits.max_video_frames} "
                         "(--max-video-frames); sample fewer frames", param)
    total = sum(len(f) for f in frames)
    if total > limits.max_video_bytes:
        raise MediaError(f"video frames total {total / 2**20:.3g} MB; the limit is "
                         f"{limits.max_video_bytes / 2**20:.3g} MB (--max-video-bytes)", param)
    sizes = [check_image_bytes(f, limits, f"{param}[{i}]" if param else None) for i, f in enumerate(frames)]
    if len({(s.width, s.height) for s in sizes}) != 1:
        raise MediaError(f"video frames differ in size ({sorted({(s.width, s.height) for s in sizes})}); "
                         "every frame of a video must have one size", param)
    return VideoInput(frames=frames, width=sizes[0].width, height=sizes[0].height)


def load_frame_list(urls: list[str], limits: MediaLimits, param: str | None = None) -> VideoInput:
    if len(urls) > limits.max_video_frames:  # before reading any of them
        raise MediaError(f"video has {len(urls)} frames; the limit is {limits.max_video_frames} "
                         "(--max-video-frames); sample fewer frames", param)
    return _check_frames([load_image(u, limits, f"{param}[{i}]" if param else None).data
                          for i, u in enumerate(urls)], limits, param)


ANIMATION_FRAMES_PER_KEPT = 8
"""An animation may have at most this many times --max-video-frames frames. Each GIF/WebP frame is painted
over the previous one, so every frame up to the last one kept is decoded, not just the kept ones; this bounds
that work (8 x 32 = 256 frames by default: ~10 s at 25 fps, sampled to ~3 fps)."""

_GIF_BLOCK = re.compile(rb"[,!;]")


def gif_frames_and_canvas(data: bytes, stop_after: int) -> tuple[int, int, int]:
    """(frames, canvas width, canvas height) of a GIF, by walking its blocks without decoding a pixel.

    Counting stops past `stop_after` frames, so a file of a million 1x1 frames costs no more than one of
    `stop_after` (PIL's n_frames walks every frame: 0.9 s for such a 17 MB file). The canvas is the largest
    extent of any frame, because PIL grows the image when a later frame reaches past the logical screen.
    """
    def skip_sub_blocks(pos: int) -> int:
        while pos < len(data) and data[pos]:
            pos += data[pos] + 1
        return pos + 1

    if len(data) < 13:
        return 0, 0, 0
    width, height, flags = *struct.unpack_from("<HH", data, 6), data[10]
    pos, frames = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0), 0
    while frames <= stop_after:
        m = _GIF_BLOCK.search(data, pos)  # PIL skips stray bytes between blocks; so does this
        if m is None or data[m.start()] == 0x3B:  # trailer
            break
        pos = m.start()
        if data[pos] == 0x21:  # extension: a label byte, then data sub-blocks
            pos = skip_sub_blocks(pos + 2)
            continue
        if pos + 10 > len(data):  # an image descriptor cut short: PIL fails on it too
            break
        x0, y0, w, h = struct.unpack_from("<HHHH", data, pos + 1)
        frames, width, height = frames + 1, max(width, x0 + w), max(height, y0 + h)
        local = data[pos + 9]
        pos = skip_sub_blocks(pos + 11 + (3 << ((local & 7) + 1) if local & 0x80 else 0))  # + LZW code size byte
    return frames, width, height


def _check_animation(n: int, width: int, height: int, limits: MediaLimits, param: str | None) -> None:
    """Refuse, before any frame is decoded, an animation whose decoding would cost more than its frames are worth."""
    if width * height > limits.max_image_pixels:
        raise MediaError(f"video frames are {width}x{height}; the limit is {limits.max_image_pixels:,} pixels "
                         "(--max-image-pixels)", param)
    most = ANIMATION_FRAMES_PER_KEPT * limits.max_video_frames
    if n > most:
        raise MediaError(f"video_url animation has more than {most} frames ({ANIMATION_FRAMES_PER_KEPT} x "
                         f"--max-video-frames {limits.max_video_frames}); send a shorter animation, or sample it "
                         'yourself and send the frames as {"type": "video", "video": [<image URLs>]}', param)
    # The same decoding work a frame list at the limits may cost: --max-video-frames frames of --max-image-pixels.
    budget = limits.max_video_frames * limits.max_image_pixels
    if n * width * height > budget:
        raise MediaError(f"video_url animation is {n} frames of {width}x{height} = {n * width * height:,} pixels "
                         f"to decode; the limit is {budget:,} (--max-video-frames x --max-image-pixels); send fewer "
                         "or smaller frames", param)


def _sample(n: int, most: int) -> list[int]:
    """Indices of `most` frames spread uniformly over `n` (all of them when n <= most)."""
    return sorted({i * n // most for i in range(most)}) if n > most else list(range(n))


def _animation_frames(data: bytes, limits: MediaLimits, param: str | None) -> list[bytes]:
    try:
        with Image.open(io.BytesIO(data), formats=list(ANIMATED)) as im:
            if im.format == "GIF":
                n, width, height = gif_frames_and_canvas(data, ANIMATION_FRAMES_PER_KEPT * limits.max_video_frames)
            else:  # WebP: libwebp's demuxer has read the frame count from the chunk headers
                n, (width, height) = getattr(im, "n_frames", 1), im.size
            _check_animation(n, width, height, limits, param)
            frames = []
            for i in _sample(n, limits.max_video_frames):
                im.seek(i)  # decodes the frames since the last kept one (each is drawn over the previous)
                buf = io.BytesIO()
                im.convert("RGB").save(buf, format="PNG")
                frames.append(buf.getvalue())
            return frames
    except MediaError:
        raise
    except Image.UnidentifiedImageError:
        raise MediaError("video_url data is not an animated GIF or WebP; send one, or the frames as "
                         '{"type": "video", "video": [<image URLs>]}', param) from None
    except Exception as e:  # truncated animations raise OSError, EOFError...
        raise MediaError(f"video is corrupt: {e}", param) from None


def load_video_url(url: str, limits: MediaLimits, param: str | None = None) -> VideoInput:
    url = url.strip()
    if url.startswith("data:"):
        mime, b64 = split_data_url(url, param, "video_url must be a data URL like data:image/gif;base64,...")
        if mime not in ("image/gif", "image/webp"):
            raise MediaError(f"video_url media type {mime or 'missing'!r} cannot be decoded here (no video decoder "
                             "is installed); send an animated image/gif or image/webp, or the frames as "
                             '{"type": "video", "video": [<image URLs>]}', param)
        data = decode_base64(b64, limits.max_video_bytes, "video", "--max-video-bytes", param)
    else:
        data = load_image(url, limits.model_copy(update={"max_image_bytes": limits.max_video_bytes}), param).data
    return _check_frames(_animation_frames(data, limits, param), limits, param)
