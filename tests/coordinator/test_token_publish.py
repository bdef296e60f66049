"""publish_tokens: one step's events in one round trip, one entry per stream holding that stream's events in order,
each stream written given its TTL once (not once per event)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from coordinator.protocol.messages import TokenEvent
from coordinator.protocol.streams import TOKEN_STREAM_TTL_S, parse_token_events, publish_tokens

pytestmark = pytest.mark.redis


async def test_one_step_reaches_each_stream_in_order_with_one_ttl_renewal_per_stream(redis_url, key_prefix):
    r = Redis.from_url(redis_url)
    a, b = f"{key_prefix}:replies:a", f"{key_prefix}:replies:b"
    events = [(a, TokenEvent(request_id="r1", index=0, token_ids=[5])), (b, TokenEvent(request_id="r2", index=0, token_ids=[6])),
              (a, TokenEvent(request_id="r3", index=0, token_ids=[7])), (a, TokenEvent(request_id="r1", index=1, token_ids=[8]))]
    expires_before, xadds_before = await _calls(r, "expire"), await _calls(r, "xadd")
    try:
        await publish_tokens(r, events)
        entries_a, entries_b = await r.xrange(a), await r.xrange(b)
        assert len(entries_a) == len(entries_b) == 1  # one entry per stream, not one per event
        assert [(e.request_id, e.token_ids) for e in parse_token_events(entries_a[0][1])] == [
            ("r1", [5]), ("r3", [7]), ("r1", [8])]
        assert [e.token_ids for e in parse_token_events(entries_b[0][1])] == [[6]]
        for key in (a, b):
            assert 0 < await r.ttl(key) <= TOKEN_STREAM_TTL_S
        assert await _calls(r, "expire") - expires_before == 2  # one per stream, not one per event (4)
        assert await _calls(r, "xadd") - xadds_before == 2
    finally:
        await r.delete(a, b)
        await r.aclose()


async def _calls(r: Redis, command: str) -> int:
    return int((await r.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))
