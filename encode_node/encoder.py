"""The LLaVA encoder: a real transformers LLaVA vision tower + projector, batched."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from PIL import Image

from coordinator.protocol.messages import EncodedMedia, Modality
from encode_node.encoded import EncodedBatch, check_modality, decode_each, decode_image, split_per_request

__all__ = ["EncodedBatch", "LlavaImageEncoder"]


class LlavaImageEncoder:
    """Loads the checkpoint, keeps only the vision side, encodes many requests' images in one pass.

    The language model is dropped right after loading (on the CPU), so an encode GPU holds only
    the vision tower and projector.
    """

    modalities = frozenset({"image"})

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
            pixels = self.processor.image_processor(images=flat, return_tensors="pt")["pixel_values"]
            out = self.model.get_image_features(pixel_values=pixels.to(self.device))
            feats = [f.to("cpu", torch.float32) for f in out.pooler_output]
        per_request = split_per_request(decoded, feats, self.hidden_size)
        media, i = [], 0
        for ims in decoded:
            n = len(ims or [])
            media.append([EncodedMedia(modality="image", num_tokens=f.shape[0]) for f in feats[i : i + n]])
            i += n
        return EncodedBatch(per_request, errors, time.perf_counter() - t0, media)
