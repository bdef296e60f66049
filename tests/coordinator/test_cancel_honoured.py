"""Forever-loops end when cancelled even if a library turns the cancellation into an error of its own.

redis-py closes its socket when a blocking read is cancelled, and that close can surface as a ConnectionError
instead of the CancelledError; a loop that retries on errors then never ends, and a shutdown (or an event loop
closing in a test) waits on it forever. The body below does what that library path does: it swallows the
cancellation and raises a ConnectionError."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError

from coordinator.protocol.process import forever, honour_cancel


async def _read_that_swallows_cancel() -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        raise RedisConnectionError("Connection closed by server.") from None


async def test_forever_ends_when_its_cancel_was_turned_into_an_error():
    task = asyncio.create_task(forever("reader", _read_that_swallows_cancel, asyncio.Event(), backoff_s=0.01))
    await asyncio.sleep(0.05)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert task in done and task.cancelled()


async def test_an_error_without_a_cancel_is_retried():
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RedisConnectionError("Redis restarting")
        await asyncio.sleep(10)

    task = asyncio.create_task(forever("reader", flaky, asyncio.Event(), backoff_s=0.01))
    await asyncio.sleep(0.2)
    assert calls == 3 and not task.done()
    task.cancel()
    await asyncio.wait({task}, timeout=2.0)
    assert task.cancelled()


async def test_honour_cancel_is_silent_outside_a_cancel():
    honour_cancel()  # no pending cancel: returns
