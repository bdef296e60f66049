"""Turn a video content part into checked frames (encoded images) before anything is queued.

Two request formats are accepted (see coordinator/api/schema.py's VideoPart):
- `{"type": "video", "video": [<image URL>, ...]}`: the frames, already sampled by the client (the
  Qwen / qwen-vl-utils message format); each URL is a data URL or an allowed local path, like image_url.
- `{"type": "video_url", "video_url": {"url": ...}}` (vLLM's format) naming an animated GIF or WebP,
  as a data URL or an allowed local path: PIL decodes it (no video library needed); when it has more
  frames than --max-video-frames, that many are sampled uniformly. MP4/WebM need a video decoder this
  server does not ship, and are refused with a 4xx saying what to send instead.

A list with too many frames is refused rather than sampled: the client chose those frames.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageSequence

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


def _animation_frames(data: bytes, limits: MediaLimits, param: str | None) -> list[bytes]:
    try:
        with Image.open(io.BytesIO(data), formats=list(ANIMATED)) as im:
            if im.size[0] * im.size[1] > limits.max_image_pixels:
                raise MediaError(f"video frames are {im.size[0]}x{im.size[1]}; the limit is "
                                 f"{limits.max_image_pixels:,} pixels (--max-image-pixels)", param)
            n = getattr(im, "n_frames", 1)
            keep = sorted({int(i * n / limits.max_video_frames) for i in range(limits.max_video_frames)}) \
                if n > limits.max_video_frames else list(range(n))
            frames = []
            for i, frame in enumerate(ImageSequence.Iterator(im)):
                if i in keep:
                    buf = io.BytesIO()
                    frame.convert("RGB").save(buf, format="PNG")
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
