"""The LLM worker computes on its own thread: every engine add and step of a real worker on one thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from redis.asyncio import Redis

import llm_node.worker as worker_mod
from coordinator.protocol.messages import PrefillJob, SamplingParams
from coordinator.protocol.process import cancel_and_wait
from llm_node.config import LLMWorkerConfig
from llm_node.engine import EngineConfig, ReferenceEngine
from llm_node.worker import LLMWorker
from transport.registry import make_receiver, make_sender

pytestmark = pytest.mark.redis


class RecordingEngine(ReferenceEngine):
    """The real engine, noting which thread each add and step ran on."""

    threads: list[tuple[str, str]]

    def add(self, request):
        self.threads.append(("add", threading.current_thread().name))
        return super().add(request)

    def step(self):
        self.threads.append(("step", threading.current_thread().name))
        return super().step()


async def test_engine_adds_and_steps_all_run_on_the_workers_compute_thread(tiny, redis_url, key_prefix, tmp_path,
                                                                           tokenizer):
    model, processor = tiny
    engine = RecordingEngine(model, processor.tokenizer, EngineConfig(role="combined"))
    engine.threads = []
    redis = Redis.from_url(redis_url)
    cfg = LLMWorkerConfig(worker_id="w0", redis_url=redis_url, key_prefix=key_prefix)
    worker = LLMWorker(cfg, redis, engine, make_receiver("local", "w0", runtime_dir=tmp_path), make_sender("local"))
    await worker.receiver.start()
    stop = asyncio.Event()
    loop = asyncio.create_task(worker_mod.forever("engine", worker.engine_once, stop))
    busy = []
    try:
        for rid in ("A", "B", "C"):
            job = PrefillJob(request_id=rid, prompt_token_ids=tokenizer("what is this")["input_ids"],
                             sampling=SamplingParams(max_tokens=3), arrival=time.time())
            worker.jobs_by_id[rid] = job
            busy += [asyncio.create_task(asyncio.to_thread(time.sleep, 0.01)) for _ in range(3)]  # a busy pool
            await worker.admit("0-0", job)
        deadline = time.monotonic() + 10
        while worker.jobs_by_id and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not worker.jobs_by_id, "the requests did not finish"
    finally:
        stop.set()
        assert not await cancel_and_wait([loop], 5.0)
        await asyncio.gather(*busy)
        worker.compute.close()
        await worker.receiver.close()
        await redis.aclose()
    kinds = {kind for kind, _ in engine.threads}
    names = {name for _, name in engine.threads}
    assert kinds == {"add", "step"} and len(engine.threads) >= 6, engine.threads
    assert len(names) == 1 and names.pop().startswith("w0-engine"), engine.threads


async def _run_worker_until_idle(worker, jobs: list[PrefillJob], timeout_s: float = 10.0) -> None:
    """Queue `jobs` (their tensors none: text only), run the engine loop until the worker holds nothing."""
    stop = asyncio.Event()
    for job in jobs:
        worker.jobs_by_id[job.request_id] = job
    for job in jobs:  # both queued before the loop's first look: they enter the engine in one engine_once
        await worker.admit("0-0", job)
    loop = asyncio.create_task(worker_mod.forever("engine", worker.engine_once, stop))
    try:
        deadline = time.monotonic() + timeout_s
        while worker.jobs_by_id and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not worker.jobs_by_id, "the requests did not finish"
    finally:
        stop.set()
        assert not await cancel_and_wait([loop], 5.0)


def _worker(tiny, redis, redis_url, key_prefix, tmp_path) -> LLMWorker:
    model, processor = tiny
    cfg = LLMWorkerConfig(worker_id="w0", redis_url=redis_url, key_prefix=key_prefix)
    return LLMWorker(cfg, redis, ReferenceEngine(model, processor.tokenizer, EngineConfig(role="combined")),
                     make_receiver("local", "w0", runtime_dir=tmp_path), make_sender("local"))


async def test_a_requests_add_and_first_step_are_one_call_to_the_compute_thread(tiny, redis_url, key_prefix, tmp_path,
                                                                                 tokenizer):
    """On its way to the first token a request crosses to the compute thread once, not once to be added and
    once more to be stepped."""
    redis = Redis.from_url(redis_url)
    worker = _worker(tiny, redis, redis_url, key_prefix, tmp_path)
    calls = []
    real_run = worker.compute.run
    worker.compute.run = lambda fn, *a: (calls.append(fn), real_run(fn, *a))[1]
    try:
        await _run_worker_until_idle(worker, [PrefillJob(
            request_id="one", prompt_token_ids=tokenizer("what is this")["input_ids"],
            sampling=SamplingParams(max_tokens=1), arrival=time.time())])
    finally:
        worker.compute.close()
        await redis.aclose()
    assert len(calls) == 1, calls


async def test_a_refused_request_fails_alone_beside_one_that_runs(tiny, redis_url, key_prefix, tmp_path, tokenizer):
    from coordinator.protocol.keys import Keys
    from coordinator.protocol.streams import parse_token_events

    redis = Redis.from_url(redis_url)
    worker = _worker(tiny, redis, redis_url, key_prefix, tmp_path)
    ids = tokenizer("what is this")["input_ids"]
    good = PrefillJob(request_id="good", prompt_token_ids=ids, sampling=SamplingParams(max_tokens=3), arrival=time.time())
    bad = PrefillJob(request_id="bad", prompt_token_ids=[*ids, 10**6], sampling=SamplingParams(max_tokens=3),
                     arrival=time.time())
    try:
        await _run_worker_until_idle(worker, [bad, good])
        events = {}
        for rid in ("good", "bad"):
            entries = await redis.xrange(Keys(key_prefix).tokens(rid))
            events[rid] = [ev for _, fields in entries for ev in parse_token_events(fields)]
    finally:
        worker.compute.close()
        await redis.aclose()
    assert [ev.finish_reason for ev in events["bad"]] == ["error"]
    assert "refused by w0" in events["bad"][0].error and "vocabulary" in events["bad"][0].error
    assert sum(len(ev.token_ids) for ev in events["good"]) == 3 and events["good"][-1].finish_reason == "length"
