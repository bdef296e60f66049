"""Batched forwards of the language model: prefill of several prompts, and one decode step.

The runner holds a Hugging Face model (LLaVA, or any decoder-only causal LM with `.model` and
`.lm_head`) and never its vision tower's work: modality embeddings arrive computed elsewhere and are
scattered into the image-token positions of the prompt, exactly where LLaVA itself puts them.

Prefill right-pads the prompts: every real position then only sees real positions before it, so no
attention row is fully masked; logits are computed at each prompt's last real position only.
Decode left-pads the caches (see llm_node/kv.py). Both pass explicit position ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from llm_node.kv import KVLayout, SequenceKV, build_decode_batch, new_positions, split_prefill_cache


@dataclass
class PrefillResult:
    logits: torch.Tensor
    """[B, vocab] float32, at each prompt's last position."""
    kvs: list[SequenceKV]
    """Each prompt's cache, cut to its own length."""


@dataclass
class DecodeResult:
    logits: torch.Tensor
    """[B, vocab] float32, for the token after each fed token."""
    new_kv: torch.Tensor
    """[layers, 2, B, kv_heads, 1, head_dim]: the fed tokens' keys and values, to append per sequence."""


class ModelRunner:
    """Holds the model and runs its forwards in inference mode."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        self.config = model.config
        self.image_token_id: int | None = getattr(model.config, "image_token_id", None)
        self.layout = KVLayout.from_config(model.config, model.dtype)
        self.device = model.device
        self.hidden_size = model.get_input_embeddings().embedding_dim

    def check_mm(self, prompt_ids: list[int], mm_embeddings: torch.Tensor | None) -> None:
        """Raise ValueError unless the embeddings fill the prompt's image-token positions exactly."""
        positions = 0 if self.image_token_id is None else sum(t == self.image_token_id for t in prompt_ids)
        rows = 0 if mm_embeddings is None else mm_embeddings.shape[0]
        if mm_embeddings is not None and (mm_embeddings.dim() != 2 or mm_embeddings.shape[1] != self.hidden_size):
            raise ValueError(
                f"modality embeddings must be [n_tokens, {self.hidden_size}], got {tuple(mm_embeddings.shape)}"
            )
        if positions != rows:
            raise ValueError(
                f"prompt has {positions} image-token positions (id {self.image_token_id}) "
                f"but {rows} modality embedding rows were given"
            )

    @torch.inference_mode()
    def embed(self, prompt_ids: list[int], mm_embeddings: torch.Tensor | None) -> torch.Tensor:
        """Token embeddings of the prompt [L, hidden] with the modality embeddings in the image-token slots."""
        self.check_mm(prompt_ids, mm_embeddings)
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        embeds = self.model.get_input_embeddings()(ids)
        if mm_embeddings is None or mm_embeddings.shape[0] == 0:
            return embeds
        mask = (ids == self.image_token_id).unsqueeze(-1)
        return embeds.masked_scatter(mask, mm_embeddings.to(device=self.device, dtype=embeds.dtype))

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], mm_embeddings: list[torch.Tensor | None]) -> PrefillResult:
        """Run the prompts as one right-padded batch; returns last-position logits and per-prompt caches."""
        embeds = [self.embed(p, mm) for p, mm in zip(prompts, mm_embeddings, strict=True)]
        lengths = [e.shape[0] for e in embeds]
        batch, t_max = len(embeds), max(lengths)
        inputs = embeds[0].new_zeros((batch, t_max, embeds[0].shape[1]))
        mask = torch.zeros((batch, t_max), dtype=torch.long, device=self.device)
        for i, e in enumerate(embeds):
            inputs[i, : e.shape[0]] = e
            mask[i, : e.shape[0]] = 1
        positions = torch.arange(t_max, device=self.device).unsqueeze(0).expand(batch, t_max)
        cache = DynamicCache(config=self.config)
        out = self.model.model(
            inputs_embeds=inputs, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        last = torch.tensor(lengths, device=self.device) - 1
        hidden = out.last_hidden_state[torch.arange(batch, device=self.device), last]
        logits = self.model.lm_head(hidden).float()
        return PrefillResult(logits=logits, kvs=split_prefill_cache(cache, lengths))

    @torch.inference_mode()
    def decode(self, token_ids: list[int], kvs: list[SequenceKV]) -> DecodeResult:
        """Feed one token per sequence on top of its cache; the caches themselves are left untouched."""
        batch = build_decode_batch(kvs, self.config)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        inputs = self.model.get_input_embeddings()(ids)
        out = self.model.model(
            inputs_embeds=inputs,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            cache=batch.cache,
            use_cache=True,
        )
        logits = self.model.lm_head(out.last_hidden_state[:, -1]).float()
        return DecodeResult(logits=logits, new_kv=new_positions(batch.cache))
