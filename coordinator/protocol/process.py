"""The life of a worker process: open Redis, run supervised loops until a signal, close Redis."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

log = logging.getLogger(__name__)


async def run_until_signalled(redis_url: str, run: Callable[[Redis, asyncio.Event], Awaitable[None]]) -> None:
    """`run(redis, stop)` should return soon after `stop` is set; Redis is closed whatever happens."""
    redis = Redis.from_url(redis_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run(redis, stop)
    finally:
        await redis.aclose()


async def forever(name: str, body: Callable[[], Awaitable[None]], stop: asyncio.Event, backoff_s: float = 0.5) -> None:
    """Run `body()` until `stop`; an exception (a Redis hiccup) is logged and retried, never fatal."""
    while not stop.is_set():
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception:
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
    for t in [stopper, *tasks]:
        t.cancel()
    await asyncio.gather(stopper, *tasks, return_exceptions=True)
