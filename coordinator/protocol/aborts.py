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
from coordinator.protocol.process import honour_cancel

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0
"""Longest wait for a pub/sub connection to close when the listener ends or resubscribes."""


ALL_ATTEMPTS = 1 << 30


def abort_message(request_id: str, up_to_attempt: int | None = None) -> str:
    """The channel's text: "rid" aborts every attempt (the client left); "rid#N" only attempts <= N (the
    coordinator re-ran the request as attempt N+1, and a worker thought dead may still hold an old one)."""
    return request_id if up_to_attempt is None else f"{request_id}#{up_to_attempt}"


def parse_abort(text: str) -> tuple[str, int]:
    """(request id, highest attempt aborted)."""
    rid, sep, n = text.rpartition("#")
    if sep and n.isdigit():
        return rid, int(n)
    return text, ALL_ATTEMPTS


class RecentAborts:
    """Request ids aborted within the last `ttl_s` seconds (at most `capacity`, oldest dropped first),
    each with the highest attempt the abort covers."""

    def __init__(self, ttl_s: float = 600.0, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.capacity, self.clock = ttl_s, capacity, clock
        self._ids: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def add(self, request_id: str, up_to_attempt: int = ALL_ATTEMPTS) -> None:
        old = self._ids.get(request_id, (0.0, -1))[1]
        self._ids[request_id] = (self.clock(), max(old, up_to_attempt))
        self._ids.move_to_end(request_id)
        self._purge()

    def covers(self, request_id: str, attempt: int) -> bool:
        """Whether attempt `attempt` of the request was aborted."""
        self._purge()
        entry = self._ids.get(request_id)
        return entry is not None and attempt <= entry[1]

    def __contains__(self, request_id: str) -> bool:
        """Whether any attempt of the request was aborted."""
        self._purge()
        return request_id in self._ids

    def _purge(self) -> None:
        cutoff = self.clock() - self.ttl_s
        while self._ids and (len(self._ids) > self.capacity or next(iter(self._ids.values()))[0] < cutoff):
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
            honour_cancel()
            log.warning(f"{what} channel lost; resubscribing", extra={"error": str(e)})
            await asyncio.sleep(backoff_s)
        finally:
            try:  # bounded: a connection that hangs while closing must not hold a shutdown
                await asyncio.wait_for(pubsub.aclose(), CLOSE_WAIT_S)
            except Exception:  # already broken, or stuck; nothing left to release
                pass
