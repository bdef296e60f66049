"""The routing view (coordinator/protocol/routing_view.py) on a real Redis: concurrent dispatches share one registry
scan, a scan is reused while young, routes while stale with a new scan beside it, is waited for when older, an
empty one is never reused, and it routes as WorkerRegistry.alive does."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import WorkerInfo
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.routing_view import RoutingView

pytestmark = pytest.mark.redis


def _info(wid: str, role: str) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, role=role, host="h", pid=1, model="m", started_at=time.time())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_shares_scans_while_young_and_matches_the_registry(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    reg = WorkerRegistry(redis, Keys(key_prefix), heartbeat_ttl_s=5.0)
    clock = Clock()
    view = RoutingView(reg, max_age_s=0.02, clock=clock)
    try:
        assert await view.alive(frozenset({"combined"})) == [] and view.scans == 1
        assert await view.alive(frozenset({"combined"})) == [] and view.scans == 2  # an empty view is not reused
        await reg.register(_info("l0", "combined"), load=3)
        await reg.register(_info("e0", "encode"))
        await reg.heartbeat(_info("l1", "combined"), 0, draining=True)
        views = await asyncio.gather(*(view.alive(frozenset({"combined", "prefill"})) for _ in range(20)))
        assert view.scans == 3  # twenty concurrent dispatches, one scan
        direct = [(w.info, w.load) for w in await reg.alive(frozenset({"combined", "prefill"}))]
        assert all([(w.info, w.load) for w in v] == direct for v in views)
        assert [w.info.worker_id for w in views[0]] == ["l0"]  # the draining one is not routed to
        assert [w.info.worker_id for w in await view.alive(frozenset({"encode"}))] == ["e0"] and view.scans == 3

        await reg.heartbeat(_info("l0", "combined"), 7)
        clock.now += 0.019
        assert (await view.alive(frozenset({"combined"})))[0].load == 3 and view.scans == 3  # still young
        clock.now += 0.002  # past max_age_s, within stale_s: routed on the old view, a scan starts beside it
        assert (await view.alive(frozenset({"combined"})))[0].load == 3 and view.scans == 3
        for _ in range(200):  # bounded: the scan is two Redis round trips
            if view.scans == 4:
                break
            await asyncio.sleep(0.005)
        assert view.scans == 4 and (await view.alive(frozenset({"combined"})))[0].load == 7

        await reg.heartbeat(_info("l0", "combined"), 9)
        clock.now += view.stale_s + 0.001  # older than stale_s: this request waits for the scan
        assert (await view.alive(frozenset({"combined"})))[0].load == 9 and view.scans == 5
    finally:
        await redis.aclose()


async def test_a_cancelled_caller_does_not_cancel_the_shared_scan(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    reg = WorkerRegistry(redis, Keys(key_prefix), heartbeat_ttl_s=5.0)
    view = RoutingView(reg)
    try:
        await reg.register(_info("l0", "combined"))
        first = asyncio.ensure_future(view.alive(frozenset({"combined"})))
        second = asyncio.ensure_future(view.alive(frozenset({"combined"})))
        await asyncio.sleep(0)
        first.cancel()
        assert [w.info.worker_id for w in await second] == ["l0"] and view.scans == 1
    finally:
        await redis.aclose()


async def test_kept_fresh_between_requests_a_light_load_request_waits_for_no_scan(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    reg = WorkerRegistry(redis, Keys(key_prefix), heartbeat_ttl_s=5.0)
    view = RoutingView(reg)
    keeper = asyncio.ensure_future(view.keep_fresh(every_s=0.02))
    try:
        await reg.register(_info("l0", "combined"))
        for _ in range(20):  # requests 0.1 s apart: each finds a view younger than stale_s
            await asyncio.sleep(0.1)
            assert view.age_s < view.stale_s
            assert [w.info.worker_id for w in await view.alive(frozenset({"combined"}))] == ["l0"]
        assert view.scans >= 20  # the keeper scanned between them
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        await redis.aclose()


async def test_a_rescan_sees_a_worker_gone_from_a_fresh_view(redis_url, key_prefix):
    """A caller that found a worker of the view dead (the encode worker, after every send failed) scans again at
    once, however fresh the view: the worker whose record expired is gone from what it gets."""
    redis = Redis.from_url(redis_url)
    reg = WorkerRegistry(redis, Keys(key_prefix), heartbeat_ttl_s=5.0)
    view = RoutingView(reg, max_age_s=60.0, stale_s=60.0)
    try:
        await reg.register(_info("l0", "combined"))
        await reg.register(_info("l1", "combined"))
        assert [w.info.worker_id for w in await view.alive(frozenset({"combined"}))] == ["l0", "l1"]
        await reg.deregister("l0")
        assert [w.info.worker_id for w in await view.alive(frozenset({"combined"}))] == ["l0", "l1"]  # as fresh
        assert [w.info.worker_id for w in await view.rescan(frozenset({"combined"}))] == ["l1"] and view.scans == 2
    finally:
        await redis.aclose()
