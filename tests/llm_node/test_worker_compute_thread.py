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
