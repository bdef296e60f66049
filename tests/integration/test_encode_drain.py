"""An encode worker retired under load drains (real processes on a real Redis): once SIGTERMed its registry
record says draining, so the coordinator's dispatch queues nothing new for it, it finishes the micro-batches
already released to it, then exits. Nothing is lost and, unlike a worker that stops at once, nothing it held
has to be re-run: every request is served by its first run with the answer it gets with no retirement."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis
from cluster_factory import serve_cluster

from benchmarks.faults.load import SteadyLoad, classify, counts, expected_answers, request_body
from coordinator.protocol.keys import Keys

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.long]
IMAGES = [0, 1, 2, 3]
MAX_TOKENS = 8
BURST = 12
"""Requests sent at once so the retired encoder surely holds queued micro-batches when SIGTERM comes."""
STEADY = 10
"""Requests of the steady load at least, before, during and after the drain."""


@pytest.fixture
def two_encoders(redis_url, tmp_path):
    """encode-0 as `tierserve up` starts it, and encode-9 started with a drain timeout (as a plan switch does).
    Pass-through dispatch, so each request of a burst is a micro-batch of its own and several wait on the
    retired encoder's stream (the default work-conserving policy releases one batch at a time to an idle
    encoder, so a burst never queues there). Without direct links, so those batches wait where the test can see
    them (on a job link they wait in the worker's memory; its drain counts them the same way, JobInbox.waiting,
    tests/encode_node/test_job_inbox.py)."""
    served = serve_cluster(tmp_path / "logs", encode_workers=1, llm_roles=["combined"], redis_url=redis_url,
                           coordinator_args=["--batch-policy", "pass_through", "--no-direct-links"])
    cluster = next(served)
    keys, client = Keys(cluster.spec.key_prefix), redis.Redis.from_url(redis_url)
    try:
        cluster.add_worker("encode-9", "encode_node", "encode", None, ["--drain-timeout-s", "30"])
        deadline = time.monotonic() + 180
        while not client.exists(keys.worker("encode-9")):
            assert cluster.procs["encode-9"].poll() is None, cluster.tail("encode-9")
            assert time.monotonic() < deadline, "encode-9 did not register"
            time.sleep(0.2)
        yield cluster, client, keys
    finally:
        client.close()
        served.close()  # stops the cluster, deletes its keys


def draining(client: redis.Redis, keys: Keys, worker_id: str) -> bool | None:
    """The worker's registry flag; None once it has left the registry."""
    raw = client.get(keys.worker(worker_id))
    return None if raw is None else bool(json.loads(raw).get("draining"))


def test_a_retired_encode_worker_finishes_its_micro_batches_and_takes_no_new_ones(two_encoders):
    cluster, client, keys = two_encoders
    expected = asyncio.run(expected_answers(cluster.url, cluster.spec.model_name, IMAGES, MAX_TOKENS))
    stream = keys.jobs("encode-9")

    async def go():
        load = SteadyLoad(cluster.url, cluster.spec.model_name, expected, rate=2.0, max_tokens=MAX_TOKENS)
        stop = asyncio.Event()
        running = asyncio.create_task(load.run(stop, max_requests=500))
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client_http:
            await asyncio.sleep(1.0)
            burst = [asyncio.create_task(classify(client_http, cluster.url,
                                                  request_body(cluster.spec.model_name, i % 4, max_tokens=MAX_TOKENS),
                                                  expected[i % 4], 120, 5)) for i in range(BURST)]
            deadline = time.monotonic() + 30
            while client.xlen(stream) < 2:  # micro-batches wait on its stream: retire it now
                assert time.monotonic() < deadline, "encode-9 never had micro-batches queued"
                await asyncio.sleep(0.005)
            held_at_stop = client.xlen(stream)
            proc = cluster.retire("encode-9")
            flags = []
            while proc.poll() is None and time.monotonic() < deadline + 30:
                flags.append(draining(client, keys, "encode-9"))
                await asyncio.sleep(0.05)
            burst_out = await asyncio.gather(*burst)
            # arrivals go on after the drain, and long enough for STEADY of them in all, with one arrival to spare
            # (a fast drain ended the load at 9 in a clean-clone CI, short of the bound below)
            await asyncio.sleep(max(1.0, started + (STEADY + 1) / load.rate - time.monotonic()))
        stop.set()
        return await running, burst_out, held_at_stop, flags, proc.returncode

    outcomes, burst_out, held_at_stop, flags, code = asyncio.run(go())
    tally = counts(outcomes + burst_out)
    log = cluster.tail("encode-9", 400)
    print(f"\nencode-9 held {held_at_stop} micro-batches at SIGTERM; requests: {tally}; exit code {code}")
    assert code == 0 and "drained" in log, log[-2000:]
    assert True in flags and False not in flags[flags.index(True):], flags  # draining from SIGTERM's first beat on
    assert tally["lost"] == tally["wrong"] == tally["errored"] == 0, [o.detail for o in outcomes + burst_out
                                                                        if o.kind != "served"]
    assert tally["rerun"] == 0, tally  # what encode-9 held was finished there, not re-run elsewhere
    assert tally["served"] == tally["sent"] >= BURST + STEADY
