"""Registry liveness and the dispatcher's policy plumbing, on a real Redis."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from coordinator.dispatch import EncodeDispatcher
from coordinator.policies.base import Arrival, BatchPolicyConfig, Release
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import EncodeJob, MediaRef, SamplingParams, WorkerInfo
from coordinator.protocol.registry import WorkerRegistry, least_loaded
from coordinator.protocol.streams import JobStream

pytestmark = pytest.mark.redis


def _info(wid: str, role: str = "encode") -> WorkerInfo:
    return WorkerInfo(worker_id=wid, role=role, host="h", pid=1, model="m", started_at=time.time())


def _job(rid: str) -> EncodeJob:
    return EncodeJob(request_id=rid, prompt_token_ids=[1, 2], sampling=SamplingParams(), arrival=time.time(),
                     media=[MediaRef(key=f"k:{rid}")])


async def test_worker_drops_out_when_heartbeats_stop(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    reg = WorkerRegistry(redis, keys, heartbeat_ttl_s=5.0)
    try:
        e0, l0 = _info("e0"), _info("l0", "combined")
        await reg.register(e0, load=2)
        await reg.register(l0)
        alive = await reg.alive()
        assert [(w.info.worker_id, w.load) for w in alive] == [("e0", 2), ("l0", 0)]
        assert alive[0].info.instance == e0.instance
        assert [w.info.worker_id for w in await reg.alive(frozenset({"combined"}))] == ["l0"]
        assert 0 < await redis.pttl(keys.worker("e0")) <= 5000  # it lapses unless renewed
        await redis.delete(keys.worker("e0"))  # what the TTL does to a worker that stopped beating
        await reg.heartbeat(l0, 1)
        live, lapsed = await reg.scan()
        assert [(w.info.worker_id, w.load) for w in live] == [("l0", 1)] and lapsed == ["e0"]
        assert await reg.reap("e0") and (await reg.scan())[1] == []
        await reg.deregister("l0")
        assert await reg.alive() == []
    finally:
        await redis.aclose()


async def test_a_heartbeat_re_registers_after_redis_lost_everything(redis_url, key_prefix):
    """FLUSHALL on a shared Redis would hit other tests: deleting every key of the prefix is the same to us."""
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    reg = WorkerRegistry(redis, keys, heartbeat_ttl_s=5.0)
    try:
        await reg.register(_info("e0"))
        stream = JobStream(redis, keys, "e0")
        await stream.open()
        await redis.delete(keys.workers, keys.worker("e0"), keys.jobs("e0"))
        assert await reg.alive() == [] and await stream.read(1, None) == []  # the read re-created the group
        await reg.heartbeat(_info("e0"), 0)
        assert [w.info.worker_id for w in await reg.alive()] == ["e0"]
        await redis.xadd(keys.jobs("e0"), {"m": _job("r1").model_dump_json()})
        assert [j.request_id for _, j in await stream.read(1, None)] == ["r1"]
    finally:
        await redis.aclose()


async def test_ack_and_count_acks_one_entry_and_counts_the_rest(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    try:
        stream = JobStream(redis, keys, "e0")
        await stream.open()
        for rid in ("r1", "r2", "r3"):
            await redis.xadd(keys.jobs("e0"), {"m": _job(rid).model_dump_json()})
        first = await stream.read(1, None)
        assert [j.request_id for _, j in first] == ["r1"]
        assert await stream.ack_and_count(first[0][0]) == 2  # r2 and r3 still queued
        assert (await redis.xpending(keys.jobs("e0"), "workers"))["pending"] == 0  # acked, not only deleted
        rest = await stream.read(2, None)
        assert [j.request_id for _, j in rest] == ["r2", "r3"]
        assert await stream.ack_and_count(rest[0][0]) == 1
        assert await stream.ack_and_count(rest[1][0]) == 0
    finally:
        await redis.aclose()


def test_least_loaded_rotates_among_ties():
    from coordinator.protocol.registry import WorkerStatus

    ws = [WorkerStatus(_info(w), 0.0, load) for w, load in (("a", 1), ("b", 0), ("c", 0))]
    assert {least_loaded(ws, i).info.worker_id for i in range(4)} == {"b", "c"}
    assert least_loaded([], 0) is None


class _HoldTwo:
    """Releases in pairs, or a lone request 1 s after it arrived: exercises the deadline path."""

    def __init__(self, config: BatchPolicyConfig) -> None:
        self.queued: list[float] = []

    def observe(self, event: Arrival, now: float) -> None:
        self.queued.append(now)

    def decide(self, now: float) -> list[Release]:
        if len(self.queued) >= 2 or (self.queued and now - self.queued[0] >= 1.0):
            n, self.queued = len(self.queued), []
            return [Release(n)]
        return []

    def next_deadline(self, now: float) -> float | None:
        return self.queued[0] + 1.0 if self.queued else None


async def test_dispatcher_releases_on_policy_decisions_and_deadlines(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    disp = EncodeDispatcher(redis, keys, BatchPolicyConfig(), _HoldTwo)
    stream = JobStream(redis, keys, "e0")
    await stream.open()
    try:
        await disp.submit("e0", _job("r1"))
        assert await stream.read(10, block_ms=1) == []  # held: the policy waits for a second one
        await disp.submit("e0", _job("r2"))
        got = await stream.read(10, block_ms=100)
        assert [[j.request_id for j in b.jobs] for _, b in got] == [["r1", "r2"]]  # one entry: one micro-batch
        await disp.submit("e0", _job("r3"))
        got = await stream.read(10, block_ms=3000)  # released by the 1 s deadline timer
        assert [[j.request_id for j in b.jobs] for _, b in got] == [["r3"]]
    finally:
        disp.close()
        await redis.aclose()


async def test_reconfigure_flushes_what_is_queued_and_applies_new_knobs(redis_url, key_prefix):
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    made: list[BatchPolicyConfig] = []

    def factory(cfg: BatchPolicyConfig) -> _HoldTwo:
        made.append(cfg)
        return _HoldTwo(cfg)

    disp = EncodeDispatcher(redis, keys, BatchPolicyConfig(max_batch=8), factory)
    stream = JobStream(redis, keys, "e0")
    await stream.open()
    try:
        await disp.submit("e0", _job("r1"))
        await disp.reconfigure(BatchPolicyConfig(name="adaptive", max_batch=4))
        got = await stream.read(10, block_ms=100)
        assert [[j.request_id for j in b.jobs] for _, b in got] == [["r1"]]  # flushed, not lost
        await disp.submit("e0", _job("r2"))
        assert [c.max_batch for c in made] == [8, 4]
    finally:
        disp.close()
        await redis.aclose()


async def test_each_modality_has_its_own_queue_and_policy(redis_url, key_prefix):
    """A micro-batch holds one modality: image and audio arrivals never share a batch or a policy."""
    redis = Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    made: list[_HoldTwo] = []

    def factory(cfg: BatchPolicyConfig) -> _HoldTwo:
        made.append(_HoldTwo(cfg))
        return made[-1]

    disp = EncodeDispatcher(redis, keys, BatchPolicyConfig(), factory)
    stream = JobStream(redis, keys, "e0")
    await stream.open()
    audio = lambda rid: _job(rid).model_copy(update={"media": [MediaRef(key="k", kind="audio")]})  # noqa: E731
    try:
        await disp.submit("e0", _job("i1"))
        await disp.submit("e0", audio("a1"))
        assert await stream.read(10, block_ms=1) == []  # one of each: both policies still hold
        await disp.submit("e0", audio("a2"))
        await disp.submit("e0", _job("i2"))
        got = await stream.read(10, block_ms=100)
        assert [[j.request_id for j in b.jobs] for _, b in got] == [["a1", "a2"], ["i1", "i2"]]
        assert len(made) == 2
    finally:
        disp.close()
        await redis.aclose()
