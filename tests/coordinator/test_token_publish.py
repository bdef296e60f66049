"""publish_tokens: one step's events in one round trip, in order per stream, each stream written given its TTL
once (not once per event)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from coordinator.protocol.messages import TokenEvent
from coordinator.protocol.streams import TOKEN_STREAM_TTL_S, parse_token_event, publish_tokens

pytestmark = pytest.mark.redis


async def test_one_step_reaches_each_stream_in_order_with_one_ttl_renewal_per_stream(redis_url, key_prefix):
    r = Redis.from_url(redis_url)
    a, b = f"{key_prefix}:replies:a", f"{key_prefix}:replies:b"
    events = [(a, TokenEvent(request_id="r1", index=0, token_ids=[5])), (b, TokenEvent(request_id="r2", index=0, token_ids=[6])),
              (a, TokenEvent(request_id="r3", index=0, token_ids=[7])), (a, TokenEvent(request_id="r1", index=1, token_ids=[8]))]
    calls_before = await _expire_calls(r)
    try:
        await publish_tokens(r, events)
        assert [parse_token_event(f).request_id for _, f in await r.xrange(a)] == ["r1", "r3", "r1"]
        assert [parse_token_event(f).token_ids for _, f in await r.xrange(b)] == [[6]]
        for key in (a, b):
            assert 0 < await r.ttl(key) <= TOKEN_STREAM_TTL_S
        assert await _expire_calls(r) - calls_before == 2  # one per stream, not one per event (4)
    finally:
        await r.delete(a, b)
        await r.aclose()


async def _expire_calls(r: Redis) -> int:
    return int((await r.info("commandstats")).get("cmdstat_expire", {}).get("calls", 0))
