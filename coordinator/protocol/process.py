"""The life of a worker process: open Redis, run until SIGINT/SIGTERM, close Redis."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis


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
