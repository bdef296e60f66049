"""The drain a rolling restart relies on: a draining worker leaves routing at once but stays visible to the
failover (so what it holds is not re-run), on a real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import WorkerInfo
from coordinator.protocol.presence import Presence
from coordinator.protocol.registry import WorkerRegistry

pytestmark = pytest.mark.redis


def _info(wid: str) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, role="prefill", host="h", pid=1, model="m", started_at=time.time())


async def test_a_draining_worker_leaves_routing_but_not_the_registry(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    reg = WorkerRegistry(redis, Keys(key_prefix), heartbeat_ttl_s=5.0)
    try:
        held = 3
        async with Presence(reg, _info("p0"), lambda: held, interval_s=0.05) as p0, \
                Presence(reg, _info("p1"), lambda: 0, interval_s=0.05):
            assert [w.info.worker_id for w in await reg.alive(frozenset({"prefill"}))] == ["p0", "p1"]
            await p0.drain()
            assert [w.info.worker_id for w in await reg.alive(frozenset({"prefill"}))] == ["p1"]
            live, lapsed = await reg.scan()
            assert {w.info.worker_id: w.draining for w in live} == {"p0": True, "p1": False} and lapsed == []
            await asyncio.sleep(0.2)  # the presence's later beats keep the flag
            assert [w.info.worker_id for w in await reg.alive()] == ["p1"]
            assert [w.info.worker_id for w in await reg.alive(draining=True)] == ["p0", "p1"]
    finally:
        await redis.aclose()
