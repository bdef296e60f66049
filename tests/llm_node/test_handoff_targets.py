"""Where a prefill worker hands a KV cache when no decode worker takes new work: the ordering a plan switch or
a loaded machine produces (a prefill finishing after its decode peer started draining, or while its heartbeat
lapsed). Real Redis, real registry records and heartbeats, the real local transport; nothing is mocked."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import JOB_ADAPTER, DecodeJob, PrefillJob, SamplingParams, WorkerInfo
from coordinator.protocol.presence import Presence
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.streams import FIELD, parse_token_events
from llm_node.handoff import HandoffError, KVHandoff
from transport.registry import make_receiver, make_sender

pytestmark = pytest.mark.redis


class Decoder:
    """A decode worker's presence and receiver, without an engine (what the hand-off sees of it)."""

    def __init__(self, registry: WorkerRegistry, worker_id: str, tmp_path) -> None:
        self.receiver = make_receiver("local", worker_id, runtime_dir=tmp_path)
        self.registry, self.worker_id = registry, worker_id
        self.presence: Presence | None = None

    async def __aenter__(self) -> Decoder:
        await self.receiver.start()
        info = WorkerInfo(worker_id=self.worker_id, role="decode", host="h", pid=1, model="m",
                          started_at=time.time(), transport_address=self.receiver.address)
        self.presence = await Presence(self.registry, info, lambda: 0, interval_s=0.05).__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.presence.leave()
        await self.receiver.close()


@pytest.fixture
async def parts(redis_url, key_prefix, tmp_path):
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    registry = WorkerRegistry(redis, keys, heartbeat_ttl_s=2.0)
    sender = make_sender("local")
    try:
        yield redis, keys, registry, sender, tmp_path
    finally:
        await sender.close()
        await redis.aclose()


KV = torch.ones(2, 3, 4)


def job(rid: str) -> PrefillJob:
    return PrefillJob(request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=4),
                      arrival=time.time())


async def stream_jobs(redis: Redis, keys: Keys, worker_id: str) -> list[DecodeJob]:
    return [JOB_ADAPTER.validate_json(f[FIELD.encode()]) for _, f in await redis.xrange(keys.jobs(worker_id))]


async def handed_to(redis: Redis, keys: Keys, worker_id: str, rid: str) -> list:
    """The jobs on `worker_id`'s stream, and the holder that the request's reply stream names."""
    jobs = await stream_jobs(redis, keys, worker_id)
    events = [e for _, f in await redis.xrange(keys.tokens(rid)) for e in parse_token_events(f)]
    return [(j.kind, j.request_id, len(j.kv)) for j in jobs] + [e.holder.worker_id for e in events if e.holder]


async def test_a_prefill_finishing_after_its_decode_peer_started_draining_still_hands_off(parts):
    """The switch retires the decode worker; a prefill that was still running then finishes. Before the fix this
    failed the request ("no decode worker is alive"); now the draining worker takes it (it runs what reaches its
    stream before it stops, and the coordinator re-runs it if the worker leaves first)."""
    redis, keys, registry, sender, tmp = parts
    handoff = KVHandoff(redis, keys, registry, sender, wait_s=0.5)
    kv = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    async with Decoder(registry, "d0", tmp) as d0:
        await d0.presence.drain()
        assert await registry.alive(frozenset({"decode"})) == []  # routing sees no decode worker
        assert await handoff.send(job("r1"), [7], kv, lambda j: False) == "d0"
        assert await handed_to(redis, keys, "d0", "r1") == [("decode", "r1", 1), "d0"]
        got = await d0.receiver.recv((await stream_jobs(redis, keys, "d0"))[0].kv, 5.0)
        assert torch.equal(got["kv"], kv)


async def test_a_decode_worker_taking_work_is_preferred_to_a_draining_one(parts):
    redis, keys, registry, sender, tmp = parts
    handoff = KVHandoff(redis, keys, registry, sender, wait_s=0.5)
    async with Decoder(registry, "d0", tmp) as d0, Decoder(registry, "d1", tmp):
        await d0.presence.drain()
        for i in range(3):
            assert await handoff.send(job(f"r{i}"), [7], KV, lambda j: False) == "d1"


async def test_a_hand_off_waits_for_a_decode_worker_whose_heartbeat_lapsed_to_return(parts):
    """No decode worker registered at the moment the prefill ends (its heartbeat came late, or a new one is
    starting): the hand-off waits for it rather than failing the request."""
    redis, keys, registry, sender, tmp = parts
    handoff = KVHandoff(redis, keys, registry, sender, wait_s=5.0)

    async def late() -> None:
        await asyncio.sleep(0.4)
        async with Decoder(registry, "d2", tmp):
            await asyncio.sleep(2.0)

    task = asyncio.create_task(late())
    try:
        t0 = time.monotonic()
        assert await handoff.send(job("r9"), [7], KV, lambda j: False) == "d2"
        assert 0.3 < time.monotonic() - t0 < 3.0
        assert await handed_to(redis, keys, "d2", "r9") == [("decode", "r9", 1), "d2"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_with_no_decode_worker_at_all_the_hand_off_fails_after_its_wait(parts):
    redis, keys, registry, sender, _ = parts
    handoff = KVHandoff(redis, keys, registry, sender, wait_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(HandoffError, match="no decode worker is alive"):
        await handoff.send(job("r0"), [7], KV, lambda j: False)
    assert 0.25 < time.monotonic() - t0 < 2.0
