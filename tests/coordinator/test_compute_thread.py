"""A worker's compute thread: every call on one thread of its own, in order, whatever the default executor does."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from coordinator.protocol.compute_thread import ComputeThread

WHO = contextvars.ContextVar("who", default="nobody")


async def test_every_call_runs_on_one_named_thread_in_order_while_the_default_executor_is_busy():
    compute = ComputeThread("w0-engine")
    seen: list[tuple[int, str, int]] = []

    def step(i: int) -> int:
        seen.append((threading.get_ident(), threading.current_thread().name, i))
        return i * i

    def busy() -> None:  # the transport's off-loop checksums, in the default executor
        time.sleep(0.005)

    try:
        results = []
        for i in range(20):
            background = [asyncio.create_task(asyncio.to_thread(busy)) for _ in range(3)]
            results.append(await compute.run(step, i))
            await asyncio.gather(*background)
    finally:
        compute.close()
    assert results == [i * i for i in range(20)]
    assert [i for _, _, i in seen] == list(range(20))
    assert len({ident for ident, _, _ in seen}) == 1
    assert seen[0][1].startswith("w0-engine") and seen[0][0] != threading.get_ident()


async def test_calls_see_the_callers_context_and_a_closed_thread_takes_no_more_work():
    compute = ComputeThread("w0-encoder")
    WHO.set("request-7")
    assert await compute.run(WHO.get) == "request-7"
    compute.close()
    with pytest.raises(RuntimeError):
        await compute.run(WHO.get)


async def test_an_exception_in_a_call_reaches_the_caller_and_the_thread_goes_on():
    compute = ComputeThread("w0-engine")

    def fail() -> None:
        raise ValueError("bad step")

    try:
        with pytest.raises(ValueError, match="bad step"):
            await compute.run(fail)
        assert await compute.run(lambda: 3) == 3
    finally:
        compute.close()
