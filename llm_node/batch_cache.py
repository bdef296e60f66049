"""The decode batch's KV cache, kept from step to step while sequences join and leave.

A decode step left-pads every sequence to the longest, so each fed token lands in the same column (see
llm_node/kv.py). Built afresh, that batch costs a copy of every sequence's whole cache, and the model's
default cache then concatenates each layer's keys and values onto a new tensor at every step: at 32
sequences of ~270 positions, the copies were most of a decode step on a CPU, and under load, when
requests join and leave at almost every step, the batch was rebuilt almost every time.

`DecodeBatches` keeps one buffer [layers, 2, slots, kv_heads, columns, head_dim] instead:
- row r holds one sequence, its positions right-aligned to the write column `hi`: [hi - L, hi);
- a step's cache is a view of the window [hi - L_max, hi) over the live rows, and each layer writes the
  fed token's keys and values into column `hi`, in place (`_WindowLayer`), so nothing is concatenated;
- a sequence that joins is copied into a free row (its own cache only); one that leaves gives its row to
  the last live row (one row moved); one whose length is not what the buffer holds (its last step's
  results were dropped, or it was appended twice) is copied in again;
- only when a joiner is longer than `hi`, or the columns run out, is the buffer laid out afresh, with
  room on both sides, so that happens once in many steps; in the held buffer's own memory when it has the
  rows and columns (a fresh one of 64 rows x ~640 columns was ~80 MB to zero: py-spy found a live worker at
  saturation 0.5 s of a 6 s window there), in a fresh, larger one otherwise.
Rows are in the buffer's order, not the caller's: `DecodeBatch.order` maps one to the other.

Padding columns hold zeros or the stale (finite) keys of a row's earlier sequence; the attention mask
gives them weight exactly 0, so the logits are bit for bit those of a batch padded with zeros
(tests/llm_node/test_decode_batches.py). A model whose cache layers are not plain full-attention layers
(sliding windows) gets the padded-afresh batch of llm_node/kv.py at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

from llm_node.kv import DecodeBatch, SequenceKV, build_decode_batch

_MIN_ROOM = 32
"""Fewest free columns left on each side of the window when the buffer is laid out afresh."""


class _WindowLayer(DynamicLayer):
    """One decoder layer's cache for one step: a view of the batch buffer; `update` writes the step's new
    keys and values into the column after the window, in place, instead of concatenating a copy."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, lo: int, hi: int) -> None:
        super().__init__()
        self._keys_buf, self._values_buf, self._rows, self._lo, self._hi = keys, values, rows, lo, hi
        self.keys, self.values = keys[:rows, :, lo:hi], values[:rows, :, lo:hi]
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        end = self._hi + n
        if end > self._keys_buf.shape[2] or key_states.shape[0] != self._rows:
            raise RuntimeError(f"decode window: {key_states.shape[0]} rows x {n} new positions do not fit the "
                               f"batch buffer ({self._rows} rows, columns up to {self._keys_buf.shape[2]})")
        self._keys_buf[: self._rows, :, self._hi : end] = key_states
        self._values_buf[: self._rows, :, self._hi : end] = value_states
        self._hi = end
        self.keys = self._keys_buf[: self._rows, :, self._lo : end]
        self.values = self._values_buf[: self._rows, :, self._lo : end]
        return self.keys, self.values


@dataclass
class _Buffer:
    kv: torch.Tensor
    """[layers, 2, slots, kv_heads, columns, head_dim]."""
    mask: torch.Tensor
    """[slots, columns] long: 1 where a row holds a real position."""
    hi: int
    """The column the next step's fed tokens go to; every row's positions end just before it."""


class DecodeBatches:
    """Builds each decode step's batch from a buffer kept across steps; see the module docstring."""

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = max_rows
        """Most sequences a decode step can hold (the engine's max_num_seqs): a buffer never has more rows; None:
        no bound known, a buffer has twice the rows it is laid out with."""
        self._buf: _Buffer | None = None
        self._rows: list[SequenceKV] = []
        """Row r's sequence (held, so `id` identifies it)."""
        self._lengths: list[int] = []
        """Positions of row r in the buffer, counting the column the current step writes."""
        self.steps = 0
        self.reused = 0
        """Steps that copied no sequence's cache into the buffer (joins, re-copies and layouts do)."""
        self.rows_copied = 0
        """Sequences copied in from their own cache (a join or a re-copy); a counter for tests and benchmarks."""
        self.layouts = 0
        """Times the buffer was laid out afresh (in the held buffer's memory or a fresh one)."""
        self.allocations = 0
        """Fresh buffers among those layouts."""

    @property
    def keeping(self) -> bool:
        """Whether a buffer (a copy of its sequences' caches) is held."""
        return self._buf is not None

    def clear(self) -> None:
        """Forget the buffer (its memory goes with it)."""
        self._buf, self._rows, self._lengths = None, [], []

    def build(self, kvs: list[SequenceKV], config: PretrainedConfig) -> DecodeBatch:
        if not kvs:
            raise ValueError("a decode step needs at least one sequence")
        cache = DynamicCache(config=config)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            return build_decode_batch(kvs, config)
        self.steps += 1
        copied, layouts = self.rows_copied, self.layouts
        self._drop_rows_not_in(kvs)
        self._place(kvs)
        buf = self._buf
        assert buf is not None
        rows, hi = len(self._rows), buf.hi
        l_max = max(self._lengths)
        lo = hi - l_max
        buf.mask[:rows, hi] = 1
        for layer in range(buf.kv.shape[0]):
            cache.layers[layer] = _WindowLayer(buf.kv[layer, 0], buf.kv[layer, 1], rows, lo, hi)
        device = buf.kv.device
        row_of = {id(seq): r for r, seq in enumerate(self._rows)}
        order = [row_of[id(kv)] for kv in kvs]
        positions = torch.tensor(self._lengths, dtype=torch.long, device=device).unsqueeze(1)
        batch = DecodeBatch(cache=cache, attention_mask=buf.mask[:rows, lo : hi + 1].clone(), position_ids=positions,
                            order=None if order == list(range(rows)) else order)
        # The forward writes column hi: afterwards every row is one longer and the next step writes hi + 1.
        buf.hi += 1
        self._lengths = [n + 1 for n in self._lengths]
        if self.rows_copied == copied and self.layouts == layouts:
            self.reused += 1
        return batch

    def _drop_rows_not_in(self, kvs: list[SequenceKV]) -> None:
        """Free the rows of sequences not in this step; the last live row moves into each hole."""
        wanted = {id(kv) for kv in kvs}
        r = 0
        while r < len(self._rows):
            if id(self._rows[r]) in wanted:
                r += 1
                continue
            last = len(self._rows) - 1
            if r != last:
                assert self._buf is not None
                self._buf.kv[:, :, r] = self._buf.kv[:, :, last]
                self._buf.mask[r] = self._buf.mask[last]
                self._rows[r], self._lengths[r] = self._rows[last], self._lengths[last]
            self._rows.pop()
            self._lengths.pop()

    def _place(self, kvs: list[SequenceKV]) -> None:
        """Give every sequence of the step a row holding exactly its cache, ending just before column `hi`."""
        held = {id(seq) for seq in self._rows}
        joining = [kv for kv in kvs if id(kv) not in held]
        buf = self._buf
        if (buf is None or max(kv.length for kv in kvs) > buf.hi or buf.hi + 1 > buf.kv.shape[4]
                or len(self._rows) + len(joining) > buf.kv.shape[2]):
            self._layout(kvs)
            return
        for r, seq in enumerate(self._rows):
            if seq.length != self._lengths[r]:  # its last step's results were dropped, or it grew some other way
                self._write_row(r, seq)
                self.rows_copied += 1
        for kv in joining:
            self._rows.append(kv)
            self._lengths.append(0)
            self._write_row(len(self._rows) - 1, kv)
            self.rows_copied += 1

    def _write_row(self, r: int, kv: SequenceKV) -> None:
        buf = self._buf
        assert buf is not None
        n = kv.length
        buf.kv[:, :, r, :, buf.hi - n : buf.hi] = kv.view()
        buf.mask[r].zero_()
        buf.mask[r, buf.hi - n : buf.hi] = 1
        self._lengths[r] = n

    def _layout(self, kvs: list[SequenceKV]) -> None:
        """A buffer holding exactly `kvs`, in their order, with free columns before and after them and free rows
        below: the held buffer again when it has the rows and the columns (its columns ran out, or a joiner was
        longer than its window), else a fresh one. Laying out again in place writes only the rows' own caches:
        a fresh buffer of 32 sequences x ~300 positions is ~80 MB to zero, tens of ms a layout on a CPU."""
        first = kvs[0].view()
        layers, _, kv_heads, _, head_dim = first.shape
        longest = max(kv.length for kv in kvs)
        slots = max(8, 2 * len(kvs))
        if self.max_rows is not None:
            slots = max(len(kvs), min(slots, self.max_rows))
        old = self._buf
        if old is not None and self._fits(old, first, slots, longest):
            # Its memory holds zeros and finite keys of earlier rows only (all it was ever written), so the
            # padding left of each row needs no zeroing: the mask gives it weight exactly 0.
            room = (old.kv.shape[4] - longest) // 2
            self._buf = _Buffer(kv=old.kv, mask=old.mask, hi=longest + room)
        else:
            room = max(_MIN_ROOM, longest // 2)
            hi = longest + room
            self._buf = _Buffer(kv=first.new_zeros((layers, 2, slots, kv_heads, hi + room, head_dim)),
                                mask=torch.zeros((slots, hi + room), dtype=torch.long, device=first.device), hi=hi)
            self.allocations += 1
        self._rows, self._lengths = list(kvs), [0] * len(kvs)
        for r, kv in enumerate(kvs):
            self._write_row(r, kv)
        self.layouts += 1

    @staticmethod
    def _fits(buf: _Buffer, like: torch.Tensor, slots: int, longest: int) -> bool:
        """Whether `buf` can hold `slots` rows of `longest` positions with at least _MIN_ROOM free columns on each
        side, in `like`'s layout (layers, kv heads, head size, dtype, device)."""
        kv = buf.kv
        same = (kv.shape[0], kv.shape[3], kv.shape[5]) == (like.shape[0], like.shape[2], like.shape[4])
        return (same and kv.dtype == like.dtype and kv.device == like.device and kv.shape[2] >= slots
                and kv.shape[4] - longest >= 2 * _MIN_ROOM)
