"""The LLM worker process: prefill/decode jobs in, tokens out through Redis, KV out over the transport.

Two asyncio tasks share the engine: the intake task turns job messages plus the tensors they name
into engine requests; the engine loop runs `engine.step()` in a thread (the event loop stays free for
transfers and heartbeats) and publishes each step's tokens in one Redis round trip. Requests and
aborts enter the engine only between steps, so the engine needs no locks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import socket
import time

from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import AbortJob, DecodeJob, PrefillJob, TokenEvent, WorkerInfo
from coordinator.protocol.presence import Presence
from coordinator.protocol.registry import WorkerRegistry, least_loaded
from coordinator.protocol.streams import JobStream, publish_tokens, push_job
from llm_node.config import LLMWorkerConfig
from llm_node.engine import EngineRequest, ReferenceEngine, StepOutput
from transport.base import EmbeddingReceiver, EmbeddingSender

log = logging.getLogger(__name__)


class LLMWorker:
    def __init__(self, cfg: LLMWorkerConfig, redis: Redis, engine: ReferenceEngine,
                 receiver: EmbeddingReceiver, sender: EmbeddingSender):
        self.cfg = cfg
        self.redis = redis
        self.keys = Keys(cfg.key_prefix)
        self.engine = engine
        self.receiver = receiver
        self.sender = sender
        self.registry = WorkerRegistry(redis, self.keys, cfg.heartbeat_ttl_s)
        self.jobs = JobStream(redis, self.keys, cfg.worker_id)
        self.jobs_by_id: dict[str, PrefillJob | DecodeJob] = {}
        self.pending: list[EngineRequest] = []
        self.aborted: set[str] = set()
        self.wake = asyncio.Event()
        self._background: set[asyncio.Task] = set()
        self._rr = 0

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.cfg.worker_id, role=self.cfg.role, tier=self.cfg.tier, host=socket.gethostname(),
            pid=os.getpid(), model=self.cfg.model_name, transport_address=self.receiver.address,
            started_at=time.time(),
        )

    async def run(self, stop: asyncio.Event) -> None:
        await self.receiver.start()
        await self.jobs.open()
        async with Presence(self.registry, self.info(), lambda: len(self.jobs_by_id)):
            tasks = [asyncio.create_task(c) for c in (self.intake(stop), self.engine_loop(stop), self.listen_aborts())]
            await stop.wait()
            self.wake.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.sender.close()
        await self.receiver.close()

    def spawn(self, coro) -> None:
        """A fire-and-forget task, referenced until done (the loop keeps only weak references)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def intake(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for entry_id, job in await self.jobs.read(64, block_ms=500):
                if isinstance(job, (PrefillJob, DecodeJob)):
                    self.jobs_by_id[job.request_id] = job
                    self.spawn(self.admit(entry_id, job))
                else:
                    if isinstance(job, AbortJob):
                        self.abort(job.request_id)
                    await self.jobs.ack(entry_id)

    async def admit(self, entry_id: str, job: PrefillJob | DecodeJob) -> None:
        """Wait for the job's tensors, then queue it for the engine (acked only once it is queued)."""
        try:
            names = job.embeddings if isinstance(job, PrefillJob) else job.kv
            tensors = await self.receiver.recv(names, self.cfg.recv_timeout_s) if names else {}
            if job.request_id not in self.jobs_by_id:  # aborted while its tensors were in flight
                return
            job.timing = job.timing.mark("admitted" if isinstance(job, PrefillJob) else "decode_admitted")
            if isinstance(job, PrefillJob):
                req = EngineRequest(job.request_id, job.prompt_token_ids, job.sampling,
                                    mm_embeddings=tensors.get("image_embeds"))
            else:
                req = EngineRequest(job.request_id, job.prompt_token_ids, job.sampling,
                                    kv=tensors["kv"], output_token_ids=list(job.output_token_ids))
            self.pending.append(req)
            self.wake.set()
        except Exception as e:
            log.error("could not admit request", extra={"request_id": job.request_id, "error": str(e)})
            self.jobs_by_id.pop(job.request_id, None)
            await publish_tokens(self.redis, self.keys, [(job.request_id, self._error(f"{type(e).__name__}: {e}"))])
        finally:
            await self.jobs.ack(entry_id)

    def abort(self, request_id: str) -> None:
        if self.jobs_by_id.pop(request_id, None) is not None:  # a step in flight will not publish it
            self.aborted.add(request_id)
            self.wake.set()
        self.spawn(self.receiver.discard(request_id))  # tensors that arrived for it, if any

    async def listen_aborts(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.aborts)
        try:
            async for msg in pubsub.listen():
                if msg.get("type") == "message":
                    self.abort(msg["data"].decode() if isinstance(msg["data"], bytes) else msg["data"])
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def engine_loop(self, stop: asyncio.Event) -> None:
        """Step, then publish that step's tokens while the next step computes (in order, one at a time)."""
        publishing: asyncio.Task | None = None
        while not stop.is_set():
            await self.admit_pending()
            for rid in self.aborted:
                self.engine.abort(rid)
            self.aborted.clear()
            if not self.engine.has_unfinished():
                if publishing is not None:
                    await publishing
                    publishing = None
                self.wake.clear()
                await self.wake.wait()
                continue
            try:
                outputs = await asyncio.to_thread(self.engine.step)
            except Exception as e:  # a failing step fails its requests, never the worker
                log.exception("engine step failed")
                await self.fail_all(f"engine step failed: {e}")
                continue
            if publishing is not None:
                await publishing
            publishing = asyncio.create_task(self.emit(outputs))

    async def admit_pending(self) -> None:
        """Hand queued requests to the engine; one it refuses fails alone, with the engine's reason."""
        refused = []
        for req in self.pending:
            try:
                self.engine.add(req)
            except ValueError as e:
                log.error("engine refused request", extra={"request_id": req.request_id, "error": str(e)})
                self.jobs_by_id.pop(req.request_id, None)
                refused.append((req.request_id, self._error(f"refused by {self.cfg.worker_id}: {e}")))
        self.pending.clear()
        await publish_tokens(self.redis, self.keys, refused)

    async def emit(self, outputs: list[StepOutput]) -> None:
        events = []
        for out in outputs:
            job = self.jobs_by_id.get(out.request_id)
            if job is None:
                continue
            timing = job.timing.model_copy(update={
                "prefill_s": job.timing.prefill_s + out.prefill_s,
                "decode_s": job.timing.decode_s + out.decode_s,
            })
            if out.prefill_s:
                timing = timing.mark("first_token")
            if out.finished:
                timing = timing.mark("finished")
            job.timing = timing
            ev = TokenEvent(token_ids=out.new_token_ids, text=out.new_text, worker_id=self.cfg.worker_id,
                            logits=[base64.b64encode(l.float().numpy().tobytes()).decode() for l in out.logits])
            if out.handoff_kv is not None:
                self.spawn(self.hand_off(job, out))
                self.jobs_by_id.pop(out.request_id, None)
            elif out.finished:
                ev.finish_reason = out.finish_reason
                ev.prompt_tokens = len(job.prompt_token_ids)
                ev.timing = timing
                self.jobs_by_id.pop(out.request_id, None)
            events.append((out.request_id, ev))
        await publish_tokens(self.redis, self.keys, events)

    async def hand_off(self, job: PrefillJob | DecodeJob, out: StepOutput) -> None:
        """Prefill role: ship the KV cache to a decode worker and tell it to continue."""
        decoders = await self.registry.alive(frozenset({"decode"}))
        self._rr += 1
        target = least_loaded(decoders, self._rr)
        if target is None:
            await publish_tokens(self.redis, self.keys, [(job.request_id, self._error(
                "no decode worker is alive for the KV handoff; start one (tierserve up --llm prefill,decode)"))])
            return
        t0 = time.perf_counter()
        try:
            descs = await self.sender.send(target.info.transport_address, job.request_id, {"kv": out.handoff_kv})
        except Exception as e:
            await publish_tokens(self.redis, self.keys, [(job.request_id, self._error(f"KV handoff failed: {e}"))])
            return
        timing = job.timing.mark("handoff_sent", transfer_s=job.timing.transfer_s + time.perf_counter() - t0)
        await push_job(self.redis, self.keys, target.info.worker_id, DecodeJob(
            request_id=job.request_id, prompt_token_ids=job.prompt_token_ids, sampling=job.sampling,
            arrival=job.arrival, timing=timing, output_token_ids=list(out.new_token_ids), kv=descs,
        ))

    async def fail_all(self, reason: str) -> None:
        events = [(rid, self._error(reason)) for rid in self.jobs_by_id]
        for rid in list(self.jobs_by_id):
            self.engine.abort(rid)
        self.jobs_by_id.clear()
        await publish_tokens(self.redis, self.keys, events)

    def _error(self, reason: str) -> TokenEvent:
        return TokenEvent(finish_reason="error", error=reason, worker_id=self.cfg.worker_id)
