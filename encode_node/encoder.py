"""The LLaVA encoder: a real transformers LLaVA vision tower + projector, batched."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from PIL import Image

from coordinator.protocol.messages import EncodedMedia, Modality
from encode_node.encoded import EncodedBatch, check_modality, decode_each, decode_image, split_per_request
from encode_node.encoded import load_media_side
from encode_node.image_pixels import lean_pixels
from encode_node.lean_clip import LeanClipFeatures
from encode_node.vision_layers import drop_unread_layers
from native.pinned import HostStaging

__all__ = ["EncodedBatch", "LlavaImageEncoder"]
log = logging.getLogger(__name__)


class LlavaImageEncoder:
    """Loads the checkpoint, keeps only the vision side, encodes many requests' images in one pass.

    Features leave in the model's dtype (bfloat16 stays bfloat16 on the wire; the LLM casts to its own).
    `lean` (the default) drops the vision layers the features never read (vision_layers.py), makes pixel values
    without the processor's per-call overhead (image_pixels.py) and runs the tower as plain tensor operations
    (lean_clip.py), the same values to the bit; False runs transformers' processor and whole tower, the reference the
    lean path is tested and timed against.
    """

    modalities = frozenset({"image"})

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32, lean: bool = True):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.model, config = load_media_side("LlavaForConditionalGeneration", model_dir, device, dtype)
        self.dropped_layers = drop_unread_layers(self.model) if lean else 0
        """Vision layers removed because no feature reads them."""
        self.pixels, self.pixels_why = lean_pixels(self.processor.image_processor) if lean else (None, "lean=False")
        """The processor's values without its per-call overhead; None (and why) where the processor itself runs."""
        self.features, self.features_why = LeanClipFeatures.wrap(self.model) if lean else (None, "lean=False")
        """get_image_features without its per-call Python; None (and why) where the model's forward runs."""
        if lean:
            log.info("LLaVA encoder path", extra={"vision_layers_dropped": self.dropped_layers,
                                                  "lean_pixels": self.pixels_why or "yes",
                                                  "lean_tower": self.features_why or "yes"})
        self.device, self.dtype = device, dtype
        self.staging = HostStaging(device)
        """Device -> host of each batch's features: one copy into a pinned buffer (native/pinned.py)."""
        self.hidden_size = config.text_config.hidden_size
        self.image_token_id: int = config.image_token_id
        """The placeholder id in prompts: counting it gives a batch's image tokens before encoding."""
        self.placeholder_ids = frozenset({self.image_token_id})

    @staticmethod
    def decode_image(raw: bytes) -> Image.Image:
        return decode_image(raw)

    @torch.inference_mode()
    def encode(self, images_per_request: list[list[bytes]], modality: Modality = "image") -> EncodedBatch:
        check_modality(self, modality)
        t0 = time.perf_counter()
        decoded, errors = decode_each(images_per_request, decode_image, "image")
        flat = [im for ims in decoded if ims for im in ims]
        feats: list[torch.Tensor] = []
        if flat:
            feats = self.staging.to_host(self.tower(self.pixel_values(flat)))
        per_request = split_per_request(decoded, feats, self.hidden_size)
        media, i = [], 0
        for ims in decoded:
            n = len(ims or [])
            media.append([EncodedMedia(modality="image", num_tokens=f.shape[0]) for f in feats[i : i + n]])
            i += n
        return EncodedBatch(per_request, errors, time.perf_counter() - t0, media)

    def pixel_values(self, images: list[Image.Image]) -> torch.Tensor:
        """[n, 3, H, W] for the tower, on its device and in its dtype: lean where it applies, else the processor."""
        pixels = (self.pixels.pixels(images) if self.pixels is not None
                  else self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"])
        return pixels.to(self.device, self.dtype)

    def tower(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """One [tokens, hidden] feature tensor per image: lean unless it does not apply or a hook is registered."""
        if self.features is not None and not self.features.hooked():
            return self.features(pixels)
        return list(self.model.get_image_features(pixel_values=pixels).pooler_output)
