"""What the encode worker keeps off a request's path: the policy GET (a loop of its own) and the count of queued
micro-batches (read before the embeddings leave only when an LLM worker shares this encoder's GPU). Real Redis:
the round trips are counted by the server itself (MONITOR, filtered on this test's keys)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis

from coordinator.policies.base import PolicyConfig
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import WorkerInfo
from coordinator.protocol.process import open_worker_redis
from coordinator.protocol.registry import WorkerStatus
from coordinator.redis_server import free_port
from encode_node.config import EncodeWorkerConfig
from encode_node.worker import POLICY_REFRESH_S, EncodeWorker, _shares_gpu

ME = "enc-0"


def _worker_status(worker_id: str, colocated_with: str | None, role: str = "combined") -> WorkerStatus:
    info = WorkerInfo(worker_id=worker_id, role=role, tier="cpu", host="h", pid=1, model="m", started_at=0.0,
                      colocated_with=colocated_with)
    return WorkerStatus(info=info, load=0, heartbeat_age_s=0.0)


def _finished(value=None, error: Exception | None = None) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


def test_a_gpu_is_shared_only_when_the_scan_shows_a_worker_on_it():
    async def go():
        remote, stealing = _worker_status("llm-0", None), _worker_status("steal-0", ME)
        prefill, elsewhere = _worker_status("pre-0", ME, role="prefill"), _worker_status("steal-1", "enc-1")
        running = asyncio.get_running_loop().create_future()
        cancelled = asyncio.get_running_loop().create_future()
        cancelled.cancel()
        failed = _finished(error=ConnectionError("redis went away"))
        out = [_shares_gpu(_finished([remote, elsewhere]), ME), _shares_gpu(_finished([remote, stealing]), ME),
               _shares_gpu(_finished([prefill]), ME), _shares_gpu(running, ME), _shares_gpu(cancelled, ME),
               _shares_gpu(failed, ME), _shares_gpu(_finished([]), ME)]
        failed.exception()  # retrieved: no "never retrieved" warning
        return out

    assert asyncio.run(go()) == [False, True, True, True, True, True, False]


def _worker(redis_url: str, key_prefix: str, redis: aioredis.Redis) -> EncodeWorker:
    cfg = EncodeWorkerConfig(worker_id=ME, redis_url=redis_url, key_prefix=key_prefix)
    return EncodeWorker(cfg, redis, encoder=None)  # these paths never touch the model


class Monitor:
    """The commands the server runs on one key, as MONITOR shows them (other tests may share the server)."""

    def __init__(self, redis_url: str) -> None:
        self._redis = aioredis.Redis.from_url(redis_url)
        self.seen: list[str] = []
        self._task: asyncio.Future | None = None

    async def __aenter__(self) -> Monitor:
        started = asyncio.Event()

        async def watch() -> None:
            async with self._redis.monitor() as mon:
                started.set()
                async for cmd in mon.listen():
                    self.seen.append(cmd["command"])

        self._task = asyncio.ensure_future(watch())
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(0.1)
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        await self._redis.aclose()

    async def calls(self, command: str, key: str) -> int:
        await asyncio.sleep(0.1)  # what the server ran has reached the monitor
        return sum(line == f"{command} {key}" for line in self.seen)


@pytest.mark.redis
def test_the_queue_is_counted_before_the_embeddings_leave_only_for_a_shared_gpu(redis_url, key_prefix):
    async def go():
        r = aioredis.Redis.from_url(redis_url)
        w = _worker(redis_url, key_prefix, r)
        try:
            ids = [await r.xadd(w.jobs.key, {"job": "{}"}) for _ in range(3)]  # the batch being encoded, two behind it
            w.current = ids[0].decode()  # it came off the stream (not the job link)
            async with Monitor(redis_url) as mon:
                alone = _finished([_worker_status("llm-0", None)])
                pending_alone = await w.release_gpu(alone)
                xlen_alone = await mon.calls("XLEN", w.jobs.key)
                busy_alone = w.channel.encoder_busy

                shared = _finished([_worker_status("llm-0", None), _worker_status("steal-0", ME)])
                pending_shared = await w.release_gpu(shared)
                xlen_shared = await mon.calls("XLEN", w.jobs.key) - xlen_alone
                busy_shared = w.channel.encoder_busy
            w.channel.encoder_exit(False)
            return pending_alone, xlen_alone, busy_alone, pending_shared, xlen_shared, busy_shared, w.queued_batches
        finally:
            w.channel.close()
            await w.sender.close()
            await r.aclose()

    pending_alone, xlen_alone, busy_alone, pending_shared, xlen_shared, busy_shared, queued = asyncio.run(go())
    # Alone on its GPU: no count, no round trip, the GPU handed back at once.
    assert (pending_alone, xlen_alone, busy_alone) == (None, 0, False)
    # A stealing worker beside it: counted (two queued behind this one), and it stays busy for them.
    assert (pending_shared, xlen_shared, busy_shared, queued) == (2, 1, True, 2)


OUTAGE_GET_S = 5.0
"""Longest a GET on open_worker_redis's client takes against a refused port: its retries' backoff (~3.5 s)."""


@pytest.mark.redis
def test_the_policy_is_followed_without_any_batch(redis_url, key_prefix):
    """A knob set through Redis reaches the worker within about a second while it encodes nothing; while Redis
    refuses connections the knobs last read stay and the loop goes on, and a later change is followed."""
    async def go():
        r = aioredis.Redis.from_url(redis_url)
        w = _worker(redis_url, key_prefix, r)
        stop = asyncio.Event()
        loop = asyncio.ensure_future(w.follow_policy(stop))
        refused = None
        try:
            assert w.router.offload.share == 0.0
            await r.set(Keys(key_prefix).policy, PolicyConfig.model_validate({"offload": {"s": 0.5}}).model_dump_json())
            deadline = asyncio.get_running_loop().time() + 3 * POLICY_REFRESH_S
            while w.router.offload.share != 0.5 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            followed = w.router.offload.share
            async with Monitor(redis_url) as mon:
                await asyncio.sleep(2.5 * POLICY_REFRESH_S)
                gets = await mon.calls("GET", Keys(key_prefix).policy)
            refused = open_worker_redis(f"redis://127.0.0.1:{free_port()}/0")  # the worker's own client, refused
            w.redis = refused
            await asyncio.sleep(2.5 * POLICY_REFRESH_S)
            outage = (w.router.offload.share, loop.done())
            w.redis = r
            await r.set(Keys(key_prefix).policy, PolicyConfig.model_validate({"offload": {"s": 0.25}}).model_dump_json())
            # A GET caught mid-retry on the refused client ends within its backoff (~3.5 s), then a second passes.
            deadline = asyncio.get_running_loop().time() + OUTAGE_GET_S + 3 * POLICY_REFRESH_S
            while w.router.offload.share != 0.25 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            back = w.router.offload.share
            stop.set()
            await asyncio.wait_for(loop, 2 * POLICY_REFRESH_S)
            return followed, gets, outage, back
        finally:
            loop.cancel()
            if refused is not None:
                await refused.aclose()
            w.channel.close()
            await w.sender.close()
            await r.aclose()

    followed, gets, outage, back = asyncio.run(go())
    assert followed == 0.5
    assert 2 <= gets <= 3  # one GET a second
    assert outage == (0.5, False)  # Redis unreachable: the knobs last read stay, the loop goes on
    assert back == 0.25


@pytest.mark.redis
def test_a_batch_reads_no_registry_while_the_view_is_kept_fresh(redis_url, key_prefix):
    """Where a batch's embeddings can go comes from the worker's routing view, scanned between batches: no
    registry read runs beside a forward (it ran on the encoder's core, under its GIL). A worker that registers
    is still seen within two refresh periods."""
    from coordinator.protocol.registry import WorkerRegistry
    from encode_node.worker import VIEW_REFRESH_S

    async def go():
        r = aioredis.Redis.from_url(redis_url)
        w = _worker(redis_url, key_prefix, r)
        registry = WorkerRegistry(r, Keys(key_prefix), 10.0)
        await registry.register(_worker_status("llm-0", None).info)
        fresh = asyncio.ensure_future(w.view.keep_fresh(VIEW_REFRESH_S))
        try:
            await asyncio.sleep(VIEW_REFRESH_S / 2)
            async with Monitor(redis_url) as mon:
                batches = [[s.info.worker_id for s in await w.prefill_targets()] for _ in range(5)]
                await asyncio.sleep(0.1)
                index_reads = sum(line.startswith(f"ZRANGE {Keys(key_prefix).workers} ") for line in mon.seen)
            scans_before = w.view.scans
            await registry.register(_worker_status("llm-1", None).info)
            deadline = asyncio.get_running_loop().time() + 2 * VIEW_REFRESH_S + 1.0
            seen = []
            while "llm-1" not in seen and asyncio.get_running_loop().time() < deadline:
                seen = [s.info.worker_id for s in await w.prefill_targets()]
                await asyncio.sleep(0.01)
            return batches, index_reads, seen, w.view.scans > scans_before
        finally:
            fresh.cancel()
            w.channel.close()
            await w.sender.close()
            await r.aclose()

    batches, index_reads, seen, rescanned = asyncio.run(go())
    assert batches == [["llm-0"]] * 5
    assert index_reads <= 3  # keep_fresh's own scans over ~0.2 s; five batches made none of their own
    assert seen == ["llm-0", "llm-1"] and rescanned


def test_a_job_for_a_worker_newer_than_the_view_is_routed_after_a_scan_not_failed(redis_url, key_prefix):
    """A job pinned to a worker that registered after the view's last scan (a cluster that just came up: CI saw
    one fail with "no LLM worker is alive" 61 ms after that worker registered) is chosen again on a fresh scan."""
    import time

    from coordinator.protocol.messages import EncodeJob, MediaRef, SamplingParams
    from coordinator.protocol.registry import WorkerRegistry
    from encode_node.routing import Targets

    async def go():
        r = aioredis.Redis.from_url(redis_url)
        w = _worker(redis_url, key_prefix, r)
        registry = WorkerRegistry(r, Keys(key_prefix), 10.0)
        await registry.register(_worker_status("llm-0", None).info)
        try:
            view = Targets.sort(await w.view.rescan(frozenset({"combined", "prefill"})), ME)
            await registry.register(_worker_status("llm-1", None, role="prefill").info)
            job = EncodeJob(request_id="r", prompt_token_ids=[1], sampling=SamplingParams(), arrival=time.time(),
                            media=[MediaRef(key="m")], prefill_worker="llm-1")
            in_view = w.router.choose(job, view, time.monotonic())
            again = await w.choose_again(job)
            return in_view, again.info.worker_id if again else None
        finally:
            w.channel.close()
            await w.sender.close()
            await r.aclose()

    assert asyncio.run(go()) == (None, "llm-1")
