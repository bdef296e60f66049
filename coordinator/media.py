"""Turn an `image_url` into checked raw image bytes before anything is queued for an encoder.

Everything a client can send is bounded here: the encoded size (computed from the base64 length,
before decoding), which local files may be read, the image format (only plain raster decoders; PIL's
EPS plugin would run Ghostscript), and the pixel count (decompression bombs). The bytes are kept
as sent; the encode worker decodes them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from coordinator.data_url import decode_base64, mb, split_data_url
from coordinator.errors import MediaError


class MediaLimits(BaseModel):
    """Bounds on client media, set from the coordinator's CLI flags."""

    model_config = ConfigDict(frozen=True)

    max_image_bytes: int = Field(8 * 1024 * 1024, gt=0)
    """Largest encoded image (after base64 decoding) (--max-image-bytes)."""
    max_images_per_request: int = Field(4, ge=0)
    """Most image parts in one request, over all messages (--max-images-per-request)."""
    max_image_pixels: int = Field(16 * 1024 * 1024, gt=0)
    """Largest width*height; guards against small files that decode to huge bitmaps (--max-image-pixels)."""
    allowed_local_dirs: tuple[Path, ...] = ()
    """Directories whose files may be named by path or file:// URL; empty disables local paths
    (--allowed-local-media-dir, repeatable)."""
    allowed_formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
    """PIL format names accepted; others are refused without being parsed further."""
    max_video_frames: int = Field(32, ge=1)
    """Most frames in one video (a frame list over it is refused; an animation is sampled down to it)
    (--max-video-frames)."""
    max_video_bytes: int = Field(32 * 1024 * 1024, gt=0)
    """Largest video: all its encoded frames together, or the animation file (--max-video-bytes)."""
    max_videos_per_request: int = Field(1, ge=0)
    """Most videos in one request (--max-videos-per-request)."""
    max_audio_bytes: int = Field(16 * 1024 * 1024, gt=0)
    """Largest encoded clip, after base64 decoding (--max-audio-bytes)."""
    max_audio_seconds: float = Field(30.0, gt=0)
    """Longest clip; the model's own window (Whisper features: 30 s) may be shorter and then wins
    (--max-audio-seconds)."""
    min_audio_seconds: float = Field(0.1, gt=0)
    """Shortest clip: below a few mel frames an encoder yields no embedding at all."""
    max_audios_per_request: int = Field(4, ge=0)
    """Most input_audio parts in one request (--max-audios-per-request)."""


@dataclass(frozen=True)
class ImageInput:
    """One validated image, still encoded as the client sent it."""

    data: bytes
    format: str
    """PIL format name, e.g. "PNG"."""
    width: int
    height: int


def _expected(limits: MediaLimits) -> str:
    where = ", ".join(str(d) for d in limits.allowed_local_dirs)
    local = f"an absolute path under {where}" if where else "(local paths are disabled; see --allowed-local-media-dir)"
    return f"image_url must be a data URL like data:image/png;base64,... or {local}"


def _too_big(size: int, limits: MediaLimits, param: str | None) -> MediaError:
    return MediaError(f"image is {mb(size)}; the limit is {mb(limits.max_image_bytes)} (--max-image-bytes)", param)


def image_data_url_bytes(url: str, limits: MediaLimits, param: str | None) -> bytes:
    """The bytes of an image/* data URL, within --max-image-bytes; MediaError otherwise."""
    mime, b64 = split_data_url(url, param, _expected(limits))
    if not mime.startswith("image/"):
        raise MediaError(f"data URL media type is {mime or 'missing'!r}; send an image/* type", param)
    return decode_base64(b64, limits.max_image_bytes, "image", "--max-image-bytes", param)


def _local_path(url: str, limits: MediaLimits, param: str | None) -> Path:
    if url.startswith("file:"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError(f"file:// URLs must name a local file, not host {parsed.netloc!r}", param)
        raw = unquote(parsed.path)
    else:
        raw = url
    path = Path(raw)
    if not path.is_absolute():
        raise MediaError(_expected(limits), param)
    if not limits.allowed_local_dirs:
        raise MediaError(_expected(limits), param)
    # resolve() follows symlinks and '..', so a link inside an allowed dir cannot point outside it.
    try:
        resolved = path.resolve()
    except (ValueError, OSError) as e:  # a NUL byte, a symlink loop
        raise MediaError(f"{url!r} is not a usable file path ({e})", param) from None
    roots = [Path(d).resolve() for d in limits.allowed_local_dirs]
    if not any(resolved.is_relative_to(r) for r in roots):
        raise MediaError(f"{raw} is not under an allowed directory; {_expected(limits)}", param)
    if not resolved.is_file():
        raise MediaError(f"image file {raw} does not exist (or is not a regular file)", param)
    return resolved


def _read_file(path: Path, limits: MediaLimits, param: str | None) -> bytes:
    size = path.stat().st_size
    if size > limits.max_image_bytes:
        raise _too_big(size, limits, param)
    try:
        with path.open("rb") as f:
            data = f.read(limits.max_image_bytes + 1)  # the file may have grown since stat()
    except OSError as e:
        raise MediaError(f"cannot read image file {path}: {e.strerror}", param) from None
    if len(data) > limits.max_image_bytes:
        raise _too_big(len(data), limits, param)
    return data


def _checked_size(im: Image.Image, limits: MediaLimits, param: str | None) -> tuple[str, int, int]:
    fmt, (w, h) = im.format or "", im.size
    if w * h > limits.max_image_pixels:
        raise MediaError(f"image is {w}x{h} = {w * h:,} pixels; the limit is {limits.max_image_pixels:,} "
                         "(--max-image-pixels)", param)
    return fmt, w, h


def _pil_error(e: Exception, limits: MediaLimits, param: str | None) -> MediaError:
    """What a PIL failure on the client's bytes tells the client."""
    if isinstance(e, MediaError):
        return e
    if isinstance(e, Image.DecompressionBombError):
        return MediaError(f"image has too many pixels; the limit is {limits.max_image_pixels:,}", param)
    if isinstance(e, Image.UnidentifiedImageError):
        return MediaError(f"data is not an image in an accepted format ({', '.join(limits.allowed_formats)})", param)
    # PIL raises many types for corrupt files (SyntaxError, OSError, struct.error...)
    return MediaError(f"image is corrupt: {e}", param)


def _check_length(data: bytes, limits: MediaLimits, param: str | None) -> None:
    if not data:
        raise MediaError("image is empty", param)
    if len(data) > limits.max_image_bytes:
        raise _too_big(len(data), limits, param)


def image_header(data: bytes, limits: MediaLimits, param: str | None = None) -> tuple[str, int, int]:
    """(format, width, height) from `data`'s header, within the byte and pixel limits and of an allowed format; the
    pixels are not decoded (check_image_bytes does that too)."""
    _check_length(data, limits, param)
    try:
        with Image.open(io.BytesIO(data), formats=list(limits.allowed_formats)) as im:
            return _checked_size(im, limits, param)
    except Exception as e:
        raise _pil_error(e, limits, param) from None


def check_image_bytes(data: bytes, limits: MediaLimits, param: str | None = None) -> ImageInput:
    """Prove `data` is a whole image of an allowed format and size (its pixels decode)."""
    _check_length(data, limits, param)
    try:
        with Image.open(io.BytesIO(data), formats=list(limits.allowed_formats)) as im:
            fmt, w, h = _checked_size(im, limits, param)
            im.verify()
        # verify() checks structure only; a truncated JPEG passes it. Decoding the pixels (bounded by
        # max_image_pixels above) makes a truncated image a 400 here rather than a failure on the encoder. A JPEG
        # is decoded at 1/8 scale: every scan is still entropy-decoded, so a cut file fails the same way, in
        # 0.70x the time of a full decode at 336 px, 0.56x at 1024x768 (benchmarks/image_check.py).
        with Image.open(io.BytesIO(data), formats=list(limits.allowed_formats)) as im:
            if im.format == "JPEG":
                im.draft(im.mode, ((w + 7) // 8, (h + 7) // 8))
            im.load()
    except Exception as e:
        raise _pil_error(e, limits, param) from None
    return ImageInput(data=data, format=fmt, width=w, height=h)


def load_image(url: str, limits: MediaLimits, param: str | None = None) -> ImageInput:
    """Resolve an `image_url.url` (data URL, absolute path, or file:// URL) to checked image bytes.

    `param` names the field in error messages, e.g. `messages[0].content[1].image_url.url`.
    """
    url = url.strip()
    if url.startswith("data:"):
        data = image_data_url_bytes(url, limits, param)
    elif url.startswith(("http://", "https://")):
        raise MediaError(f"remote image URLs are not fetched; {_expected(limits)}", param)
    elif url.startswith(("file:", "/")):
        data = _read_file(_local_path(url, limits, param), limits, param)
    else:
        raise MediaError(_expected(limits), param)
    return check_image_bytes(data, limits, param)
