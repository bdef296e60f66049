"""Pre-allocated receive memory, handed out as tensors that give their blocks back when they die.

Why: a fresh 4.5 MB or 32 MB tensor per transfer is fresh pages, and the page faults cost more than the
copy (32 MB: ~8,000 faults); NIXL can only move bytes into registered memory anyway. So receivers take
blocks of one long-lived tensor, receive into them, and hand the engine a zero-copy view whose last
reference frees the blocks. The engine may hold tensors for long (a decode worker keeps its KV cache for
a whole generation), so a receiver takes pool blocks only while the pool is less than `lend_limit` used,
and otherwise falls back to fresh memory (or, for NIXL, copies out of the pool).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch


class Runs:
    """First-fit allocation of runs of `blocks` fixed-size blocks, with no memory behind it; freed runs merge.

    The NIXL sender keeps one per receiver to place its WRITEs in the part of the receiver's pool it was
    granted, and BlockPool below uses one for its own memory. Thread-safe: blocks are taken on the event
    loop and given back wherever the last view of them dies.
    """

    def __init__(self, blocks: int, block_bytes: int) -> None:
        self.blocks, self.block_bytes = blocks, block_bytes
        self._free: list[tuple[int, int]] = [(0, blocks)]  # (start, count), sorted by start
        self._used = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def used_fraction(self) -> float:
        return self._used / self.blocks

    def count(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.block_bytes))

    def alloc(self, nbytes: int) -> int | None:
        """First block of a free run of `nbytes`, or None if no run is long enough."""
        need = self.count(nbytes)
        with self._lock:
            for i, (start, n) in enumerate(self._free):
                if n >= need:
                    self._free[i : i + 1] = [(start + need, n - need)] if n > need else []
                    self._used += need
                    return start
        return None

    def free(self, start: int, nbytes: int) -> None:
        with self._lock:
            runs = sorted([*self._free, (start, self.count(nbytes))])
            merged: list[tuple[int, int]] = []
            for s, n in runs:
                if merged and merged[-1][0] + merged[-1][1] == s:
                    merged[-1] = (merged[-1][0], merged[-1][1] + n)
                else:
                    merged.append((s, n))
            self._free = merged
            self._used -= self.count(nbytes)


class BlockPool(Runs):
    """Runs of blocks in one long-lived tensor (`memory`)."""

    def __init__(self, blocks: int, block_bytes: int) -> None:
        super().__init__(blocks, block_bytes)
        self.memory = torch.empty(blocks * block_bytes, dtype=torch.uint8)

    def view(self, start: int, nbytes: int) -> torch.Tensor:
        off = start * self.block_bytes
        return self.memory[off : off + nbytes]

    def indices(self, start: int, nbytes: int) -> list[int]:
        return list(range(start, start + self.count(nbytes)))

    def lend(self, start: int, nbytes: int, release: Callable[[int, int], None] | None = None) -> memoryview:
        """A writable view of the blocks that calls `release(start, nbytes)` (default: frees them here) once it
        and every tensor made from it are gone, on whichever thread dropped the last view."""
        raw = (ctypes.c_uint8 * nbytes).from_address(self.memory.data_ptr() + start * self.block_bytes)
        raw.lease = _Lease(self.memory, start, nbytes, release or self.free)  # dies with the last view
        return memoryview(raw).cast("B")


class _Lease:
    def __init__(self, memory: torch.Tensor, start: int, nbytes: int, release) -> None:
        self.memory, self.start, self.nbytes, self.release = memory, start, nbytes, release  # memory outlives views

    def __del__(self) -> None:
        self.release(self.start, self.nbytes)


class RecvBuffers:
    """Receive buffers for one transfer: pool blocks while the pool is not too full, fresh memory otherwise."""

    def __init__(self, pool_bytes: int, *, block_bytes: int = 1 << 16, lend_limit: float = 0.5) -> None:
        self.pool = BlockPool(max(1, pool_bytes // block_bytes), block_bytes)
        self.lend_limit = lend_limit
        """Largest used share of the pool at which a new transfer still receives into it."""

    def take(self, nbytes: int) -> memoryview:
        if nbytes and self.pool.used_fraction < self.lend_limit:
            start = self.pool.alloc(nbytes)
            if start is not None:
                return self.pool.lend(start, nbytes)
        return memoryview(torch.empty(nbytes, dtype=torch.uint8).numpy())
