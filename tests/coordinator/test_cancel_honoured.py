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


async def _reply_then_idle(reply: asyncio.Future, idle: asyncio.Event) -> None:
    await asyncio.wait_for(reply, 10)  # as redis-py's socket reads and writes do
    await idle.wait()  # an engine loop with nothing to do


async def test_cancel_and_wait_ends_a_task_whose_cancel_wait_for_dropped():
    """On 3.11 a cancel that arrives as wait_for's operation completes is dropped (the reply is returned), and
    the task idles on: one cancel never ends it (an LLM worker's test hung 1 in 3 runs, and so would a worker's
    shutdown). cancel_and_wait cancels again and ends it."""
    import sys

    from coordinator.protocol.process import cancel_and_wait

    for resend in (False, True):
        reply, idle = asyncio.get_running_loop().create_future(), asyncio.Event()
        task = asyncio.create_task(_reply_then_idle(reply, idle))
        await asyncio.sleep(0)  # the task now waits in wait_for
        reply.set_result(b"+OK")
        if resend:  # its first cancel is dropped the same way; only the one it sends again ends the task
            assert not await cancel_and_wait([task], 2.0)
            assert task.cancelled()
        else:
            task.cancel()
            await asyncio.wait({task}, timeout=0.3)
            if sys.version_info < (3, 12):
                assert not task.done(), "3.11's wait_for no longer drops this cancel: the retry is moot"
            task.cancel()  # a second cancel lands in the idle wait
            await asyncio.wait({task}, timeout=2.0)
            assert task.cancelled()
