"""Image parts -> checked bytes: every way a client can get it wrong gets a message saying what to do."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image
from pydantic import ValidationError

from coordinator import data_url as data_url_module
from coordinator.data_url import base64_decoded_size
from coordinator.errors import RequestError
from coordinator.media import MediaError, MediaLimits, check_image_bytes, load_image

P = "messages[0].content[1].image_url.url"


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (32, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height but holds almost no pixel data (a bomb's first bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def load_error(url: str, limits: MediaLimits | None = None) -> MediaError:
    with pytest.raises(MediaError) as exc:
        load_image(url, limits or MediaLimits(), P)
    assert exc.value.param == P and exc.value.status == 400
    return exc.value


# --- data URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_data_url_roundtrip(fmt, mime):
    raw = image_bytes(fmt)
    img = load_image(data_url(raw, mime), MediaLimits(), P)
    assert (img.data, img.format, img.width, img.height) == (raw, fmt, 32, 24)


def test_line_wrapped_base64_is_accepted():
    b64 = base64.encodebytes(image_bytes()).decode()  # newline every 76 characters
    assert load_image(f"data:image/png;base64,{b64}", MediaLimits()).format == "PNG"


def test_invalid_base64_characters():
    assert "not valid base64" in load_error("data:image/png;base64,AAA*").message


@pytest.mark.parametrize("payload", ["AAA\u00e9", "QUFB\u00e9===", "QQ==QQ==", "QUFB=", "====", "QUFB\x00"])
def test_what_strict_base64_refuses_is_a_400(payload):
    """Non-ASCII, data after the padding, stray padding, NUL: refused with the reason, never decoded loosely."""
    assert "not valid base64" in load_error(f"data:image/png;base64,{payload}").message


def test_a_line_wrapped_payload_counts_unwrapped_against_the_limit():
    raw = image_bytes()
    wrapped = base64.encodebytes(raw).decode().replace("\n", "\n" * 40)  # 40x the newlines: "too big" until unwrapped
    assert load_image(f"data:image/png;base64,{wrapped}", MediaLimits(max_image_bytes=len(raw))).data == raw


def test_data_url_parameters_before_base64_are_allowed():
    assert load_image(f"data:image/png;name=x.png;charset=binary;base64,{base64.b64encode(image_bytes()).decode()}",
                      MediaLimits()).format == "PNG"


def test_base64_with_bad_length():
    assert "not a multiple of 4" in load_error("data:image/png;base64,AAAAA").message


def test_data_url_without_base64_marker():
    assert "data:image/png;base64,..." in load_error("data:image/png,rawbytes").message


def test_data_url_with_non_image_type():
    err = load_error(data_url(image_bytes(), "text/plain"))
    assert err.message == "data URL media type is 'text/plain'; send an image/* type"


def test_size_limit_is_checked_before_decoding(monkeypatch):
    def no_decode(*a, **k):
        raise AssertionError("decoded an oversized payload")

    monkeypatch.setattr(data_url_module.binascii, "a2b_base64", no_decode)
    err = load_error("data:image/png;base64," + "A" * 17_200_000)  # decodes to 12.9e6 bytes = 12.3 MB
    assert err.message == "image is 12.3 MB; the limit is 8 MB (--max-image-bytes)"


def test_size_limit_is_configurable():
    noise = io.BytesIO()
    Image.frombytes("RGB", (700, 700), os.urandom(700 * 700 * 3)).save(noise, format="PNG")  # ~1.4 MB
    err = load_error(data_url(noise.getvalue()), MediaLimits(max_image_bytes=2**20))
    assert err.message == f"image is {len(noise.getvalue()) / 2**20:.3g} MB; the limit is 1 MB (--max-image-bytes)"


@pytest.mark.parametrize("n", range(0, 12))
def test_base64_decoded_size_is_exact(n):
    b64 = base64.b64encode(b"x" * n).decode()
    assert base64_decoded_size(b64) == n


def test_bytes_that_are_not_an_image():
    err = load_error(data_url(b"just some text, not pixels"))
    assert err.message == "data is not an image in an accepted format (PNG, JPEG, WEBP, GIF, BMP)"


def test_format_outside_the_allow_list():
    assert "accepted format" in load_error(data_url(image_bytes("TIFF"), "image/tiff")).message
    limits = MediaLimits(allowed_formats=("TIFF",))
    assert load_image(data_url(image_bytes("TIFF"), "image/tiff"), limits).format == "TIFF"


def test_corrupt_png():
    raw = bytearray(image_bytes())
    raw[raw.index(b"IDAT") + 6] ^= 0xFF  # break the IDAT chunk's CRC
    assert load_error(data_url(bytes(raw))).message.startswith("image is corrupt")


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_a_truncated_jpeg_is_refused_though_checked_at_a_smaller_scale(progressive, cut):
    """A JPEG's pixels are decoded at 1/8 scale for the check: every scan is still read, so a cut file fails."""
    import numpy as np

    from benchmarks.bench.media import synthetic_image

    with Image.open(io.BytesIO(synthetic_image(np.random.default_rng(1), 640, 480))) as im:
        buf = io.BytesIO()
        im.save(buf, "JPEG", progressive=progressive)
    raw = buf.getvalue()
    checked = check_image_bytes(raw, MediaLimits())
    assert (checked.width, checked.height, checked.format) == (640, 480, "JPEG")  # the real size, not the scaled
    with pytest.raises(MediaError, match="image is corrupt"):
        check_image_bytes(raw[: int(len(raw) * cut)], MediaLimits())


def test_empty_image():
    assert load_error("data:image/png;base64,").message == "image is empty"


def test_pixel_limit():
    err = load_error(data_url(image_bytes(size=(100, 100))), MediaLimits(max_image_pixels=5000))
    assert err.message == "image is 100x100 = 10,000 pixels; the limit is 5,000 (--max-image-pixels)"


def test_decompression_bomb_header_is_refused_without_decoding():
    assert "9000x9000" in load_error(data_url(png_header_only(9000, 9000))).message
    # Past PIL's own hard limit Image.open itself refuses; still a MediaError.
    assert "too many pixels" in load_error(data_url(png_header_only(100_000, 100_000))).message


# --- other URL kinds ------------------------------------------------------------------------------


def test_remote_urls_are_not_fetched():
    err = load_error("https://example.com/cat.png")
    assert err.message.startswith("remote image URLs are not fetched; image_url must be a data URL like data:image/")


def test_garbage_url_says_what_to_send(tmp_path):
    err = load_error("cat.png", MediaLimits(allowed_local_dirs=(tmp_path,)))
    expected = f"image_url must be a data URL like data:image/png;base64,... or an absolute path under {tmp_path}"
    assert err.message == expected


def test_local_paths_disabled_by_default(tmp_path):
    (tmp_path / "a.png").write_bytes(image_bytes())
    assert "local paths are disabled" in load_error(str(tmp_path / "a.png")).message


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    d = tmp_path / "media"
    d.mkdir()
    (d / "cat.png").write_bytes(image_bytes())
    (tmp_path / "secret.png").write_bytes(image_bytes())
    return d


def test_local_path_and_file_urls_under_allowed_dir(media_dir):
    limits = MediaLimits(allowed_local_dirs=(media_dir,))
    for url in (str(media_dir / "cat.png"), f"file://{media_dir}/cat.png", f"file://localhost{media_dir}/cat.png"):
        assert load_image(url, limits).data == image_bytes()


def test_path_outside_allowed_dirs(media_dir):
    err = load_error(str(media_dir.parent / "secret.png"), MediaLimits(allowed_local_dirs=(media_dir,)))
    assert "is not under an allowed directory" in err.message


def test_dotdot_and_symlink_escapes(media_dir):
    limits = MediaLimits(allowed_local_dirs=(media_dir,))
    assert "not under an allowed directory" in load_error(f"{media_dir}/../secret.png", limits).message
    (media_dir / "link.png").symlink_to(media_dir.parent / "secret.png")
    assert "not under an allowed directory" in load_error(str(media_dir / "link.png"), limits).message


def test_missing_file(media_dir):
    err = load_error(str(media_dir / "dog.png"), MediaLimits(allowed_local_dirs=(media_dir,)))
    assert err.message == f"image file {media_dir / 'dog.png'} does not exist (or is not a regular file)"


def test_remote_file_url_host(media_dir):
    err = load_error(f"file://otherhost{media_dir}/cat.png", MediaLimits(allowed_local_dirs=(media_dir,)))
    assert "not host 'otherhost'" in err.message


def test_local_file_too_large(media_dir):
    err = load_error(str(media_dir / "cat.png"), MediaLimits(allowed_local_dirs=(media_dir,), max_image_bytes=10))
    assert "(--max-image-bytes)" in err.message


# --- the types -------------------------------------------------------------------------------------


def test_media_error_is_a_request_error():
    assert issubclass(MediaError, RequestError)


def test_limits_are_frozen_and_validated():
    limits = MediaLimits()
    assert (limits.max_image_bytes, limits.max_images_per_request, limits.allowed_local_dirs) == (8 * 2**20, 4, ())
    with pytest.raises(ValidationError):
        limits.max_image_bytes = 1
    with pytest.raises(ValidationError):
        MediaLimits(max_image_bytes=0)


def test_check_image_bytes_directly():
    img = check_image_bytes(image_bytes("GIF", (5, 7)), MediaLimits())
    assert (img.format, img.width, img.height) == ("GIF", 5, 7)
