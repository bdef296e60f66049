"""What the runner must know per architecture: which prompt tokens take modality embeddings, and the
positions of a prompt and of generated tokens. One small adapter class per position scheme.

- Plain RoPE (LLaVA, Qwen2-Audio): position = index; the embeddings just fill the placeholders.
- M-RoPE (Qwen2-VL): every token has (temporal, height, width) positions; vision tokens get their
  patch's grid coordinates, text continues after the largest one. The prompt's positions come from
  the model's own `get_rope_index` given each item's grid (which travels in the PrefillJob), and a
  generated token at index n sits at n + rope_delta on all three axes (`rope_delta` travels with
  the KV cache to the decode worker).
"""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from coordinator.protocol.messages import EncodedMedia

MODEL_CLASSES: dict[str, str] = {
    "llava": "LlavaForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_audio": "Qwen2AudioForConditionalGeneration",
}
"""model_type -> transformers class of the full checkpoint (the LLM node keeps the language side)."""


class PlainRope:
    """Position = index; modality embeddings fill the placeholder tokens in prompt order."""

    axes = 1
    """Position components per token (the leading dim of a position tensor)."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        self.placeholders: dict[int, str] = {}
        """Placeholder token id -> the modality whose rows fill it."""
        for attr, modality in (("image_token_id", "image"), ("video_token_id", "video"), ("audio_token_id", "audio")):
            token = getattr(config, attr, None)
            if token is not None:
                self.placeholders[token] = modality
        self.language_model: nn.Module = model.model.language_model
        """The decoder stack: called with inputs_embeds, attention_mask, position_ids and a cache."""

    def check_media(self, prompt_ids: list[int], media: list[EncodedMedia]) -> None:
        """Raise ValueError unless `media` (if given) covers the prompt's placeholder runs in order."""
        if not media:
            return
        runs = [(self.placeholders[t], len(list(g))) for t, g in itertools.groupby(prompt_ids) if t in self.placeholders]
        for modality in set(self.placeholders.values()):
            want = sum(n for m, n in runs if m == modality)
            got = sum(m.num_tokens for m in media if m.modality == modality)
            if want != got:
                raise ValueError(f"prompt has {want} {modality} placeholder tokens but its media metadata "
                                 f"accounts for {got}")

    def prompt_positions(self, prompt_ids: list[int], media: list[EncodedMedia]) -> tuple[torch.Tensor | None, int]:
        """([axes, L] positions of the prompt, or None for 0..L-1; the rope delta of generated tokens)."""
        return None, 0


class MRope(PlainRope):
    """Qwen2-VL's multimodal RoPE, computed by the model's own `get_rope_index`."""

    axes = 3

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self.model = model.model
        self.merge = model.config.vision_config.spatial_merge_size
        self.type_of = {model.config.image_token_id: 1, model.config.video_token_id: 2}

    def check_media(self, prompt_ids: list[int], media: list[EncodedMedia]) -> None:
        runs = [(self.placeholders[t], len(list(g))) for t, g in itertools.groupby(prompt_ids) if t in self.placeholders]
        if len(runs) != len(media):
            raise ValueError(f"prompt has {len(runs)} runs of vision placeholders but {len(media)} media items "
                             "came with the embeddings; M-RoPE needs every item's grid_thw")
        for i, ((modality, n), item) in enumerate(zip(runs, media)):
            if item.grid_thw is None:
                raise ValueError(f"media item {i} ({item.modality}) has no grid_thw; M-RoPE cannot place it")
            t, h, w = item.grid_thw
            if item.modality != modality or n != item.num_tokens or n != t * h * w // self.merge**2:
                raise ValueError(f"media item {i}: {item.modality} with {item.num_tokens} tokens and grid "
                                 f"{item.grid_thw} does not fill the prompt's run of {n} {modality} tokens")

    def prompt_positions(self, prompt_ids: list[int], media: list[EncodedMedia]) -> tuple[torch.Tensor | None, int]:
        if not media:
            return None, 0
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        types = torch.tensor([[self.type_of.get(t, 0) for t in prompt_ids]], dtype=torch.int)
        grids = {m: [item.grid_thw for item in media if item.modality == m] for m in ("image", "video")}
        positions, delta = self.model.get_rope_index(
            ids, mm_token_type_ids=types,
            image_grid_thw=torch.tensor(grids["image"], dtype=torch.long) if grids["image"] else None,
            video_grid_thw=torch.tensor(grids["video"], dtype=torch.long) if grids["video"] else None,
        )
        return positions[:, 0].clone(), int(delta.item())


ADAPTERS: dict[str, type[PlainRope]] = {"llava": PlainRope, "qwen2_vl": MRope, "qwen2_audio": PlainRope}


def adapter_for(model: PreTrainedModel) -> PlainRope:
    kind = model.config.model_type
    if kind not in ADAPTERS:
        raise ValueError(f"the LLM node does not know model_type {kind!r}; supported: {sorted(ADAPTERS)}")
    return ADAPTERS[kind](model)


def load_model(model_dir: Path | str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The full checkpoint through its own transformers class (`from_pretrained`, the real loading code)."""
    from transformers import AutoConfig

    kind = AutoConfig.from_pretrained(model_dir).model_type
    if kind not in MODEL_CLASSES:
        raise ValueError(f"{model_dir}: model_type {kind!r} is not served; supported: {sorted(MODEL_CLASSES)}")
    cls = getattr(importlib.import_module("transformers"), MODEL_CLASSES[kind])
    return cls.from_pretrained(model_dir, dtype=dtype).eval()
