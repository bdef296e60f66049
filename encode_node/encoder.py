"""The modality encoder: a real transformers LLaVA vision tower + projector, batched."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image


@dataclass
class EncodedBatch:
    per_request: list[torch.Tensor | None]
    """One [n_image_tokens, hidden] tensor per request, images in prompt order; None where it failed."""
    errors: list[str | None]
    """Why a request's images could not be decoded (it alone fails; the batch goes on)."""
    seconds: float
    """Wall time of decoding, preprocessing and the forward pass, for the whole batch."""


class LlavaImageEncoder:
    """Loads the checkpoint, keeps only the vision side, encodes many requests' images in one pass.

    The language model is dropped right after loading (on the CPU), so an encode GPU holds only
    the vision tower and projector.
    """

    def __init__(self, model_dir: Path, device: str = "cpu"):
        from transformers import AutoProcessor, LlavaForConditionalGeneration
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.processor = AutoProcessor.from_pretrained(model_dir)
        model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
        model.model.language_model = None
        model.lm_head = None
        self.model = model.model.eval().to(device)
        self.device = device
        self.hidden_size = model.config.text_config.hidden_size
        self.image_token_id: int = model.config.image_token_id
        """The placeholder id in prompts: counting it gives a batch's image tokens before encoding."""

    @staticmethod
    def decode_image(raw: bytes) -> Image.Image:
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")

    @torch.inference_mode()
    def encode(self, images_per_request: list[list[bytes]]) -> EncodedBatch:
        t0 = time.perf_counter()
        decoded: list[list[Image.Image] | None] = []
        errors: list[str | None] = []
        for raws in images_per_request:
            try:
                decoded.append([self.decode_image(raw) for raw in raws])
                errors.append(None)
            except Exception as e:  # e.g. a truncated JPEG that passed the coordinator's header check
                decoded.append(None)
                errors.append(f"image could not be decoded: {e}")
        flat = [im for ims in decoded if ims for im in ims]
        feats: list[torch.Tensor] = []
        if flat:
            pixels = self.processor.image_processor(images=flat, return_tensors="pt")["pixel_values"]
            out = self.model.get_image_features(pixel_values=pixels.to(self.device))
            feats = [f.to("cpu", torch.float32) for f in out.pooler_output]
        per_request: list[torch.Tensor | None] = []
        i = 0
        for ims in decoded:
            if ims is None:
                per_request.append(None)
                continue
            chunk = feats[i : i + len(ims)]
            i += len(ims)
            per_request.append(torch.cat(chunk) if chunk else torch.empty(0, self.hidden_size))
        return EncodedBatch(per_request, errors, time.perf_counter() - t0)
