"""Reads one request's own token stream (`Keys.tokens`) until its final event: for tools and tests that push
jobs without a reply_to; the coordinator reads its reply stream instead (replies.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from coordinator.flights import RelayTimeout
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import TokenEvent
from coordinator.protocol.streams import parse_token_events


async def token_events(redis: Redis, keys: Keys, request_id: str, timeout_s: float) -> AsyncIterator[TokenEvent]:
    """Yields the output events in order; stops after the one with a finish_reason; RelayTimeout past the deadline."""
    key = keys.tokens(request_id)
    last = "0-0"
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RelayTimeout(f"no final token within {timeout_s:.0f} s")
        resp = await redis.xread({key: last}, count=256, block=max(1, int(min(remaining, 1.0) * 1000)))
        for _key, entries in resp or []:
            for entry_id, fields in entries:
                last = entry_id
                for ev in parse_token_events(fields):
                    if ev.holder is not None:  # a hand-off notice, not output (the coordinator's failover uses it)
                        continue
                    yield ev
                    if ev.finish_reason is not None:
                        return
