"""LeanPixels: the image processor's own pixel values, to the bit, without its per-call overhead."""

from __future__ import annotations

import io

import pytest
import torch
from media_factory import image_bytes
from PIL import Image
from transformers import AutoProcessor

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from encode_node.image_pixels import lean_pixels


@pytest.fixture(scope="module")
def clip():
    return AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR).image_processor


def _rgb(seed: int, h: int, w: int, fmt: str = "PNG") -> Image.Image:
    return Image.open(io.BytesIO(image_bytes(seed, h, w, fmt))).convert("RGB")


@pytest.mark.parametrize("h,w,fmt", [(336, 336, "JPEG"), (300, 500, "PNG"), (500, 300, "JPEG"), (224, 224, "PNG"),
                                     (100, 80, "PNG"), (50, 1000, "JPEG"), (1000, 50, "PNG"), (7, 9, "PNG")])
def test_one_image_equals_the_processor_to_the_bit(clip, h, w, fmt):
    lean, why = lean_pixels(clip)
    assert why is None
    im = _rgb(h * w, h, w, fmt)
    want = clip(images=[im], return_tensors="pt")["pixel_values"]
    got = lean.pixels([im])
    assert got.dtype == want.dtype == torch.float32
    assert got.shape == want.shape == (1, 3, 224, 224)
    assert torch.equal(got, want)


def test_a_batch_of_mixed_shapes_equals_the_processor_in_order(clip):
    """The processor groups images by shape and resizes each group at once; one at a time gives the same values."""
    lean, _ = lean_pixels(clip)
    images = [_rgb(1, 336, 336, "JPEG"), _rgb(2, 200, 640), _rgb(3, 336, 336, "JPEG"), _rgb(4, 90, 90)]
    assert torch.equal(lean.pixels(images), clip(images=images, return_tensors="pt")["pixel_values"])


def test_an_image_that_is_not_rgb_is_refused(clip):
    lean, _ = lean_pixels(clip)
    with pytest.raises(ValueError, match="RGB"):
        lean.pixels([_rgb(5, 64, 64).convert("L")])


def test_a_processor_with_its_own_pipeline_or_settings_is_left_to_itself(clip):
    qwen = AutoProcessor.from_pretrained("coordinator/assets/tiny-qwen2-vl").image_processor
    lean, why = lean_pixels(qwen)
    assert lean is None and type(qwen).__name__ in why
    no_crop = type(clip)(**{**clip.to_dict(), "do_center_crop": False})
    lean, why = lean_pixels(no_crop)
    assert lean is None and "center-crop" in why
    lean, why = lean_pixels(object())
    assert lean is None and "not a torchvision-backend" in why
