"""Aborts: a pub/sub channel, and a bounded memory of recent ones for jobs that arrive late.

An abort can overtake its request (the client leaves while the request is still being encoded, or
while its KV cache is on the way to a decode worker), so a worker remembers aborted ids for a while
and drops their jobs on arrival.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from redis.asyncio import Redis

from coordinator.protocol.keys import Keys

log = logging.getLogger(__name__)


class RecentAborts:
    """Request ids aborted within the last `ttl_s` seconds (at most `capacity`, oldest dropped first)."""

    def __init__(self, ttl_s: float = 600.0, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.capacity, self.clock = ttl_s, capacity, clock
        self._ids: OrderedDict[str, float] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = self.clock()
        self._ids.move_to_end(request_id)
        self._purge()

    def __contains__(self, request_id: str) -> bool:
        self._purge()
        return request_id in self._ids

    def _purge(self) -> None:
        cutoff = self.clock() - self.ttl_s
        while self._ids and (len(self._ids) > self.capacity or next(iter(self._ids.values())) < cutoff):
            self._ids.popitem(last=False)


async def listen_aborts(redis: Redis, keys: Keys, on_abort: Callable[[str], None], backoff_s: float = 1.0) -> None:
    """Call `on_abort(request_id)` for every abort published; resubscribes after a Redis error."""
    await listen_channel(redis, keys.aborts, on_abort, "abort", backoff_s)


async def listen_channel(redis: Redis, channel: str, on_message: Callable[[str], None], what: str,
                         backoff_s: float = 1.0) -> None:
    """Call `on_message(text)` for every message on pub/sub `channel`, forever; resubscribes after a Redis
    error (pub/sub loses what is published meanwhile: callers must tolerate a missed message)."""
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            async for msg in pubsub.listen():
                if msg.get("type") == "message":
                    data = msg["data"]
                    on_message(data.decode() if isinstance(data, bytes) else data)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning(f"{what} channel lost; resubscribing", extra={"error": str(e)})
            await asyncio.sleep(backoff_s)
        finally:
            try:
                await pubsub.aclose()
            except Exception:  # already broken; nothing left to release
                pass
