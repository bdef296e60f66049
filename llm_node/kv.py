"""One sequence's KV cache, its wire form, and the padded batch cache of a decode step.

A sequence keeps its whole cache in one growable buffer [layers, 2, kv_heads, capacity, head_dim]
(2 = keys, values). Appending a decode position writes one slot; the buffer doubles when full, so a
sequence of length L costs O(L) copies in total, not O(L^2). The wire form is the same layout cut
to the real length, so export is one slice and import one validation.

A decode step left-pads every sequence to the longest one: the new token of each sequence then sits
at the same column, the padded slots are masked out by a 2D attention mask, and each sequence gets
its own position id. `build_decode_batch` pads afresh; llm_node/batch_cache.py keeps the padded batch
from step to step. A real paged cache is vLLM's job; this one is meant to be simple and exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig

_MIN_CAPACITY = 16


@dataclass(frozen=True)
class KVLayout:
    """The shape a model's per-sequence KV cache must have, apart from its length."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def from_config(cls, config: PretrainedConfig, dtype: torch.dtype) -> KVLayout:
        text = config.get_text_config(decoder=True)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        return cls(text.num_hidden_layers, kv_heads, head_dim, dtype)

    def check(self, kv: torch.Tensor, length: int, what: str = "kv") -> None:
        """Raise ValueError unless `kv` is a [layers, 2, kv_heads, length, head_dim] tensor of this model."""
        want = (self.num_layers, 2, self.num_kv_heads, length, self.head_dim)
        if tuple(kv.shape) != want:
            raise ValueError(f"{what}: shape {tuple(kv.shape)} != expected {want} [layers, 2, kv_heads, L, head_dim]")
        if kv.dtype != self.dtype:
            raise ValueError(f"{what}: dtype {kv.dtype} != model dtype {self.dtype}")


class SequenceKV:
    """The KV cache of one sequence: a growable buffer and its filled length."""

    def __init__(self, kv: torch.Tensor) -> None:
        """Take ownership of `kv` [layers, 2, kv_heads, L, head_dim] (not copied)."""
        if kv.dim() != 5 or kv.shape[1] != 2:
            raise ValueError(f"kv must be [layers, 2, kv_heads, L, head_dim], got shape {tuple(kv.shape)}")
        self._buf = kv
        self.length = kv.shape[3]

    def export(self) -> torch.Tensor:
        """The cache as ONE contiguous tensor [layers, 2, kv_heads, L, head_dim], independent of the buffer."""
        return self._buf[:, :, :, : self.length].clone()

    def view(self) -> torch.Tensor:
        """The filled part of the buffer, without a copy; valid until the next append."""
        return self._buf[:, :, :, : self.length]

    @torch.inference_mode()
    def append(self, new: torch.Tensor) -> None:
        """Append positions `new` [layers, 2, kv_heads, n, head_dim]."""
        n = new.shape[3]
        if self.length + n > self._buf.shape[3]:
            capacity = max(_MIN_CAPACITY, 2 * self._buf.shape[3], self.length + n)
            grown = self._buf.new_empty((*self._buf.shape[:3], capacity, self._buf.shape[4]))
            grown[:, :, :, : self.length] = self._buf[:, :, :, : self.length]
            self._buf = grown
        self._buf[:, :, :, self.length : self.length + n] = new
        self.length += n


def split_prefill_cache(cache: DynamicCache, lengths: list[int]) -> list[SequenceKV]:
    """Cut a right-padded prefill cache [B, kv_heads, T, head_dim] per layer into per-sequence caches."""
    stacked = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers])
    # stacked: [layers, 2, B, kv_heads, T, head_dim]; the real positions of sequence i are [0, L_i).
    return [SequenceKV(stacked[:, :, i, :, :length].clone()) for i, length in enumerate(lengths)]


@dataclass
class DecodeBatch:
    """The model inputs that put several sequences of different lengths into one decode forward."""

    cache: DynamicCache
    """Left-padded to the longest sequence: [B, kv_heads, L_max, head_dim] per layer."""
    attention_mask: torch.Tensor
    """[B, L_max + 1]: 0 on padding, 1 on real positions and on the new token."""
    position_ids: torch.Tensor
    """[B, 1]: each sequence's own length, the position of its new token."""
    order: list[int] | None = None
    """Row of the batch that holds the caller's i-th sequence; None: row i (llm_node/batch_cache.py keeps rows
    in its buffer's order)."""


def build_decode_batch(kvs: list[SequenceKV], config: PretrainedConfig) -> DecodeBatch:
    lengths = [kv.length for kv in kvs]
    l_max = max(lengths)
    first = kvs[0].view()
    num_layers, _, kv_heads, _, head_dim = first.shape
    padded = first.new_zeros((num_layers, 2, len(kvs), kv_heads, l_max, head_dim))
    mask = torch.zeros((len(kvs), l_max + 1), dtype=torch.long, device=first.device)
    for i, kv in enumerate(kvs):
        padded[:, :, i, :, l_max - kv.length :] = kv.view()
        mask[i, l_max - kv.length :] = 1
    cache = DynamicCache(config=config)
    for layer in range(num_layers):
        cache.update(padded[layer, 0], padded[layer, 1], layer)
    positions = torch.tensor(lengths, dtype=torch.long, device=first.device).unsqueeze(1)
    return DecodeBatch(cache=cache, attention_mask=mask, position_ids=positions)


def new_positions(cache: DynamicCache) -> torch.Tensor:
    """The last position of every sequence after a decode forward: [layers, 2, B, kv_heads, 1, head_dim]."""
    return torch.stack([torch.stack([layer.keys[:, :, -1:], layer.values[:, :, -1:]]) for layer in cache.layers])
