"""The Qwen2-VL encoder: its dynamic-resolution vision tower (with the patch merger), for images and
videos, producing embeddings AND each item's patch grid, which the prefill worker needs for M-RoPE."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from coordinator.protocol.frames import unpack_frames
from coordinator.protocol.messages import EncodedMedia, Modality
from encode_node.encoded import (
    EncodedBatch,
    check_modality,
    decode_each,
    decode_image,
    load_media_side,
    split_per_request,
)
from encode_node.video_patches import video_pixels
from native.pinned import HostStaging


class Qwen2VLEncoder:
    """Keeps only `model.visual` of a Qwen2-VL checkpoint; one forward per micro-batch.

    A micro-batch holds one modality: all its images (or all its videos) are concatenated into one
    patch sequence; the tower's attention is per item (cu_seqlens), so batching changes no result.
    """

    modalities = frozenset({"image", "video"})

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoImageProcessor

        self.image_processor = AutoImageProcessor.from_pretrained(model_dir)
        self.model, config = load_media_side("Qwen2VLForConditionalGeneration", model_dir, device, dtype)
        self.device, self.dtype = device, dtype
        self.staging = HostStaging(device)
        self.hidden_size = config.text_config.hidden_size
        self.merge = config.vision_config.spatial_merge_size
        self.placeholder_ids = frozenset({config.image_token_id, config.video_token_id})

    @torch.inference_mode()
    def encode(self, items_per_request: list[list[bytes]], modality: Modality = "image") -> EncodedBatch:
        check_modality(self, modality)
        t0 = time.perf_counter()
        if modality == "image":
            decoded, errors = decode_each(items_per_request, decode_image, "image")
            flat = [im for ims in decoded if ims for im in ims]
            pixels, grids = self._image_pixels(flat)
        else:
            decoded, errors = decode_each(items_per_request, self._video, "video")
            flat = [v for vids in decoded if vids for v in vids]
            pixels = torch.cat([rows for rows, _ in flat]) if flat else None
            grids = torch.tensor([grid for _, grid in flat], dtype=torch.long) if flat else None
        feats: list[torch.Tensor] = []
        if pixels is not None:
            get = self.model.get_image_features if modality == "image" else self.model.get_video_features
            out = get(pixels.to(self.device, self.dtype), grids.to(self.device))
            feats = self.staging.to_host(list(out.pooler_output))
        media, i = [], 0
        for items in decoded:
            n = len(items or [])
            media.append([EncodedMedia(modality=modality, num_tokens=f.shape[0], grid_thw=tuple(g.tolist()))
                          for f, g in zip(feats[i : i + n], grids[i : i + n] if n else [])])
            i += n
        return EncodedBatch(split_per_request(decoded, feats, self.hidden_size), errors, time.perf_counter() - t0,
                            media)

    def _image_pixels(self, images: list) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not images:
            return None, None
        out = self.image_processor(images=images, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def _video(self, blob: bytes) -> tuple[torch.Tensor, tuple[int, int, int]]:
        return video_pixels(self.image_processor, [decode_image(f) for f in unpack_frames(blob)])
