"""Pixel values for the vision tower from the checkpoint's own image processor, without its per-call overhead.

A transformers image processor's `__call__` validates and standardises its keyword arguments, groups the images
by shape, stacks them and wraps a BatchFeature on every call: on a CPU that is about as long as the work itself
(one 336 px image into CLIP's 224 px: 0.94 -> 0.49 ms without it, `benchmarks/encoder_forward.py`). `LeanPixels` runs the
processor's own resize, center crop and fused rescale + normalize methods with its own settings, one image at a
time, so the values are the processor's to the bit (tests/encode_node/test_image_pixels.py); the crop is made
contiguous before the normalisation, which on the resize's channels-last output was three times slower.

Only for a torchvision-backend processor whose pipeline is the backend's stock one (resize, center crop,
rescale + normalize, no padding): `lean_pixels(processor)` says why not otherwise, and the caller keeps calling
the processor.
"""

from __future__ import annotations

import torch
from PIL import Image


def _stock_torchvision(processor) -> str | None:
    """None if `processor` runs TorchvisionBackend's stock pipeline; otherwise why the lean path does not apply."""
    try:
        from transformers.image_processing_backends import TorchvisionBackend
    except ImportError as e:  # an older transformers: no backends module
        return f"transformers has no TorchvisionBackend ({e})"
    if not isinstance(processor, TorchvisionBackend):
        return f"{type(processor).__name__} is not a torchvision-backend image processor"
    for name in ("_preprocess", "_preprocess_image_like_inputs", "_prepare_image_like_inputs", "resize",
                 "center_crop", "rescale_and_normalize"):
        if getattr(type(processor), name) is not getattr(TorchvisionBackend, name):
            return f"{type(processor).__name__} overrides {name}"
    if getattr(processor, "do_pad", None):
        return f"{type(processor).__name__} pads its images"
    if not (getattr(processor, "do_resize", False) and getattr(processor, "do_center_crop", False)):
        return f"{type(processor).__name__} does not both resize and center-crop"
    return None


class LeanPixels:
    """`pixels(images)` -> [n, 3, H, W] float32, equal to `processor(images=..., return_tensors="pt")["pixel_values"]`
    for RGB PIL images (the encoder decodes every image to RGB)."""

    def __init__(self, processor) -> None:
        from torchvision.transforms.v2 import functional as tvF

        self.processor = processor
        self._to_tensor = tvF.pil_to_tensor
        p = processor
        self._size, self._crop, self._resample = p.size, p.crop_size, p.resample
        self._norm = (p.do_rescale, p.rescale_factor, p.do_normalize, p.image_mean, p.image_std)

    def pixels(self, images: list[Image.Image]) -> torch.Tensor:
        p = self.processor
        out = []
        for im in images:
            if im.mode != "RGB":
                raise ValueError(f"LeanPixels takes RGB images, got mode {im.mode!r}")
            t = p.resize(self._to_tensor(im), size=self._size, resample=self._resample)
            out.append(p.rescale_and_normalize(p.center_crop(t, self._crop).contiguous(), *self._norm))
        return torch.stack(out)


def lean_pixels(processor) -> tuple[LeanPixels | None, str | None]:
    """(LeanPixels over `processor`, None), or (None, why the processor itself has to be called)."""
    why = _stock_torchvision(processor)
    return (None, why) if why else (LeanPixels(processor), None)
