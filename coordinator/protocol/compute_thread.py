"""A worker's compute thread: the model work of a process runs off its event loop, always on the same OS thread."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ComputeThread:
    """Runs blocking model work (engine steps, encoder forwards) on one dedicated thread, in call order.

    `asyncio.to_thread` hands each call to whichever default-executor thread is free, and the transport's
    off-loop checksums keep some of them busy, so a worker's successive steps ran on different threads (five
    of them shared a live LLM worker's step CPU about equally). That costs CPU: in-process (tiny LLaVA, one
    torch thread, pinned, 280-token prompts, 48 requests in flight), steps handed round five threads took
    11.52 ms of CPU a request against 11.08 on one thread, median of six alternating runs, one thread lower in
    every pair (benchmarks/compute_thread.py, results/compute_thread.json); live, closed loop at 48 in flight,
    goodput +1 to +8 % in four interleaved A/B runs (results/bench-vllm-fast-host/)."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` on the compute thread (with the caller's context variables, as asyncio.to_thread)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(ctx.run, fn, *args))

    def close(self) -> None:
        """Take no more work; a call still running finishes on its own (its thread is not joined here)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
