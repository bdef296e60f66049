"""Batched forwards of the language model: prefill of several prompts, and one decode step.

The runner holds a Hugging Face model (LLaVA, Qwen2-VL, Qwen2-Audio: llm_node/architectures.py) and
never its encoder's work: modality embeddings arrive computed elsewhere and are scattered into the
placeholder-token positions of the prompt, exactly where the model itself puts them.

Prefill right-pads the prompts: every real position then only sees real positions before it, so no
attention row is fully masked; logits are computed at each prompt's last real position only.
Decode left-pads the caches (see llm_node/kv.py). Both pass explicit position ids: 0..L-1 and the
cache length, or for M-RoPE the prompt's 3-D positions and cache length + the sequence's rope delta.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from coordinator.protocol.messages import EncodedMedia
from llm_node.architectures import adapter_for
from llm_node.attention import use_gqa_sdpa
from llm_node.batch_cache import DecodeBatches
from llm_node.kv import KVLayout, SequenceKV, new_positions, split_prefill_cache
from llm_node.lean_forward import LeanLlama


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

    def __init__(self, model: PreTrainedModel, lean: bool = True) -> None:
        """`lean`: run a stock Llama decoder as plain tensor operations (llm_node/lean_forward.py, the same bits);
        False, or any other decoder: transformers' forward."""
        self.model = model.eval()
        self.gqa_sdpa = use_gqa_sdpa(model)
        """Masked grouped-query attention without copying the keys (CPU; llm_node/attention.py)."""
        self.config = model.config
        self.arch = adapter_for(model)
        self.placeholder_ids = torch.tensor(sorted(self.arch.placeholders), dtype=torch.long)
        self.layout = KVLayout.from_config(model.config, model.dtype)
        self.device = model.device
        self.hidden_size = model.get_input_embeddings().embedding_dim
        params = inspect.signature(self.arch.language_model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        """The decoder's name for its KV cache argument: transformers renamed past_key_values to cache, and an
        unknown keyword is swallowed by **kwargs (the cache then stays empty), so it is looked up, not assumed."""
        self.lean = LeanLlama.wrap(self.arch.language_model) if lean else None
        self.decode_batches = DecodeBatches()
        """Each decode step's padded batch, the previous step's reused when the same sequences go on."""

    def check_mm(self, prompt_ids: list[int], mm_embeddings: torch.Tensor | None,
                 media: list[EncodedMedia] | None = None) -> None:
        """Raise ValueError unless the embeddings (and media metadata) fill the prompt's placeholders exactly."""
        self._check_rows(prompt_ids, mm_embeddings)
        self.arch.check_media(prompt_ids, media or [])

    def _check_rows(self, prompt_ids: list[int], mm_embeddings: torch.Tensor | None) -> int:
        positions = sum(t in self.arch.placeholders for t in prompt_ids)
        rows = 0 if mm_embeddings is None else mm_embeddings.shape[0]
        if mm_embeddings is not None and (mm_embeddings.dim() != 2 or mm_embeddings.shape[1] != self.hidden_size):
            raise ValueError(
                f"modality embeddings must be [n_tokens, {self.hidden_size}], got {tuple(mm_embeddings.shape)}"
            )
        if positions != rows:
            raise ValueError(
                f"prompt has {positions} placeholder positions (ids {sorted(self.arch.placeholders)}) "
                f"but {rows} modality embedding rows were given"
            )
        return positions

    def check_token_ids(self, ids: list[int], what: str) -> None:
        """Raise ValueError unless every id is a row of the embedding table (ids come off a Redis stream)."""
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{what}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")

    def extend_positions(self, positions: torch.Tensor | None, n_prompt: int, n_more: int,
                         rope_delta: int) -> torch.Tensor | None:
        """The prompt's positions followed by those of `n_more` generated tokens (index + rope delta, as
        decode places them); None stays None (plain 0..L-1 positions)."""
        if positions is None:
            return None
        extra = torch.arange(n_prompt, n_prompt + n_more, dtype=positions.dtype) + rope_delta
        return torch.cat([positions, extra.expand(positions.shape[0], n_more)], dim=1)

    def prompt_positions(self, prompt_ids: list[int], media: list[EncodedMedia]) -> tuple[torch.Tensor | None, int]:
        """The prompt's position ids ([axes, L], None for 0..L-1) and the rope delta of its generated tokens."""
        return self.arch.prompt_positions(prompt_ids, media)

    @torch.inference_mode()
    def embed(self, ids: list[int], mm_embeddings: torch.Tensor | None, prompt_len: int | None = None) -> torch.Tensor:
        """Token embeddings [L, hidden] with the modality embeddings in the prompt's placeholder slots.

        Only the first `prompt_len` ids (all when None) are the prompt; the rest are tokens the model generated
        (a resumed run), embedded as text even when one is a placeholder id, as generate() embeds them."""
        n = len(ids) if prompt_len is None else prompt_len
        self._check_rows(ids[:n], mm_embeddings)
        tensor = torch.tensor(ids, dtype=torch.long, device=self.device)
        embeds = self.model.get_input_embeddings()(tensor)
        if mm_embeddings is None or mm_embeddings.shape[0] == 0:
            return embeds
        mask = torch.isin(tensor, self.placeholder_ids.to(tensor.device))
        mask[n:] = False
        return embeds.masked_scatter(mask.unsqueeze(-1), mm_embeddings.to(device=self.device, dtype=embeds.dtype))

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], mm_embeddings: list[torch.Tensor | None],
                positions: list[torch.Tensor | None] | None = None,
                prompt_lens: list[int | None] | None = None) -> PrefillResult:
        """Run the prompts as one right-padded batch; returns last-position logits and per-prompt caches.

        `positions[i]` is prompt i's [axes, L] position ids (prompt_positions), None for 0..L-1;
        `prompt_lens[i]` how many of its ids are the prompt when generated tokens follow (see embed)."""
        lens = prompt_lens or [None] * len(prompts)
        embeds = [self.embed(p, mm, n) for p, mm, n in zip(prompts, mm_embeddings, lens, strict=True)]
        lengths = [e.shape[0] for e in embeds]
        batch, t_max = len(embeds), max(lengths)
        inputs = embeds[0].new_zeros((batch, t_max, embeds[0].shape[1]))
        mask = torch.zeros((batch, t_max), dtype=torch.long, device=self.device)
        for i, e in enumerate(embeds):
            inputs[i, : e.shape[0]] = e
            mask[i, : e.shape[0]] = 1
        position_ids = self._prefill_positions(positions or [None] * batch, lengths, t_max)
        cache = DynamicCache(config=self.config)
        hidden = self._forward(inputs, mask, position_ids, cache)
        last = torch.tensor(lengths, device=self.device) - 1
        hidden = hidden[torch.arange(batch, device=self.device), last]
        logits = self.model.lm_head(hidden).float()
        return PrefillResult(logits=logits, kvs=split_prefill_cache(cache, lengths))

    def _forward(self, inputs: torch.Tensor, mask: torch.Tensor | None, position_ids: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        """The decoder's last hidden state [B, T, hidden]; the cache takes the new keys and values."""
        if self.lean is not None and not self.lean.hooked():
            return self.lean(inputs, mask, position_ids, cache)
        out = self.arch.language_model(inputs_embeds=inputs, attention_mask=mask, position_ids=position_ids,
                                       use_cache=True, **{self._cache_kw: cache})
        return out.last_hidden_state

    def _prefill_positions(self, positions: list[torch.Tensor | None], lengths: list[int], t_max: int) -> torch.Tensor:
        """[B, T] (plain) or [axes, B, T] position ids; padding columns are masked, their value is moot."""
        out = torch.arange(t_max, device=self.device).expand(self.arch.axes, len(lengths), t_max).clone()
        for i, (p, n) in enumerate(zip(positions, lengths, strict=True)):
            if p is not None:
                out[:, i, :n] = p.to(self.device)
        return out[0] if self.arch.axes == 1 else out

    @torch.inference_mode()
    def decode(self, token_ids: list[int], kvs: list[SequenceKV], rope_deltas: list[int] | None = None) -> DecodeResult:
        """Feed one token per sequence on top of its cache; the caches themselves are left untouched.

        The fed token of a sequence with cache length L sits at position L + its rope delta."""
        batch = self.decode_batches.build(kvs, self.config)
        order = batch.order
        if order is not None:  # the batch's rows are in its buffer's order: feed and read back in that order
            rows = [0] * len(order)
            for i, r in enumerate(order):
                rows[r] = i
            token_ids = [token_ids[i] for i in rows]
            rope_deltas = None if rope_deltas is None else [rope_deltas[i] for i in rows]
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        inputs = self.model.get_input_embeddings()(ids)
        position_ids = batch.position_ids
        if rope_deltas is not None:
            position_ids = position_ids + torch.tensor(rope_deltas, device=self.device).unsqueeze(1)
        if self.arch.axes > 1:
            position_ids = position_ids.unsqueeze(0).expand(self.arch.axes, -1, -1)
        hidden = self._forward(inputs, batch.attention_mask, position_ids, batch.cache)
        logits = self.model.lm_head(hidden[:, -1]).float()
        new_kv = new_positions(batch.cache)
        if order is not None:
            index = torch.tensor(order, device=self.device)
            logits, new_kv = logits[index], new_kv[:, :, index]
        return DecodeResult(logits=logits, new_kv=new_kv)
