"""The life of a worker process: open Redis, run supervised loops until a signal, close Redis."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

log = logging.getLogger(__name__)
RETRIES = 6


def open_worker_redis(redis_url: str) -> Redis:
    """A client that retries a command on a broken connection (with backoff, for about 3 s): after a Redis
    restart every pooled connection is stale, and without retries each one's first command fails. A retried
    write may land twice; token events carry their index, so the coordinator drops a repeat."""
    return Redis.from_url(redis_url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
                          retry_on_error=[ConnectionError, TimeoutError])


async def run_until_signalled(redis_url: str, run: Callable[[Redis, asyncio.Event], Awaitable[None]]) -> None:
    """`run(redis, stop)` should return soon after `stop` is set; Redis is closed whatever happens."""
    redis = open_worker_redis(redis_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(redis, stop)
    finally:
        await redis.aclose()


def honour_cancel() -> None:
    """Call in a forever-loop's `except Exception:` before retrying. A library may turn the task's cancellation
    into an error of its own (redis-py closing its socket under a cancelled blocking read can raise a
    ConnectionError instead): the loop would then retry forever, and a shutdown that cancelled it, or an event
    loop closing, would wait on it forever. A cancel request still pending on the task is honoured here."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


CANCEL_AGAIN_S = 0.1


async def cancel_and_wait(tasks, timeout_s: float | None = 10.0) -> set[asyncio.Future]:
    """Cancel the tasks and wait until they end, cancelling those still running again every CANCEL_AGAIN_S.

    Python 3.11's `asyncio.wait_for`, which redis-py's socket reads and writes go through, drops a cancel that
    arrives as its inner operation completes: the task goes on to its next await as if nothing happened, and
    when that is an idle wait (an engine loop waiting for work) a single cancel never ends it. A cancel sent
    again lands there. Returns the tasks still running after `timeout_s` (None: wait as long as it takes); the
    outcomes of the ended ones are read, so none is reported as never retrieved."""
    loop = asyncio.get_running_loop()
    pending = {asyncio.ensure_future(t) for t in tasks}
    everything = set(pending)
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while pending:
        wait = CANCEL_AGAIN_S if deadline is None else min(CANCEL_AGAIN_S, deadline - loop.time())
        if wait <= 0:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait)
    for t in everything - pending:
        if not t.cancelled():
            t.exception()
    if pending:
        log.warning("tasks still running after being cancelled", extra={"tasks": [repr(t)[:200] for t in pending]})
    return pending


async def forever(name: str, body: Callable[[], Awaitable[None]], stop: asyncio.Event, backoff_s: float = 0.5) -> None:
    """Run `body()` until `stop`; an exception (a Redis hiccup) is logged and retried, never fatal."""
    while not stop.is_set():
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception:
            honour_cancel()
            log.exception("loop iteration failed; retrying", extra={"loop": name})
            await asyncio.sleep(backoff_s)


async def supervise(loops: list[Awaitable[None]], stop: asyncio.Event) -> None:
    """Run the loops until `stop` is set or one of them ends (a bug): then stop all, so the process
    exits and deregisters instead of heartbeating while it no longer works."""
    tasks = [asyncio.ensure_future(c) for c in loops]
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not stopper and not t.cancelled() and t.exception() is not None:
            log.error("worker loop died; stopping the worker", exc_info=t.exception())
    stop.set()
    await cancel_and_wait([stopper, *tasks])
