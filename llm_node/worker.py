"""The LLM worker process: prefill/decode jobs in, tokens out through Redis, KV out over the transport.

Three supervised loops share the engine: intake turns job messages plus the tensors they name into
engine requests; the engine loop runs `engine.step()` in a thread (the event loop stays free for
transfers and heartbeats) and publishes each step's tokens in one Redis round trip while the next step
computes; the abort listener drops requests whose client left. A worker on an encode GPU steps
through its `LLMGpuShare` (gpu_share.py): a stealing worker only while the encoder is idle. Requests and aborts enter the engine
only between steps, so the engine needs no locks. A request this worker cannot finish (it stops, or a
previous run of it crashed) is answered with an error, never left to time out.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import time

from redis.asyncio import Redis

from coordinator.protocol.aborts import RecentAborts, listen_aborts
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import AbortJob, DecodeJob, PrefillJob, TokenEvent, WorkerInfo
from coordinator.protocol.presence import Presence
from coordinator.protocol.process import forever, supervise
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.streams import JobStream, publish_tokens
from llm_node.config import LLMWorkerConfig
from llm_node.engine import EngineRequest, ReferenceEngine, StepOutput
from llm_node.gpu_share import LLMGpuShare
from llm_node.handoff import KVHandoff
from transport.base import EmbeddingReceiver, EmbeddingSender

log = logging.getLogger(__name__)
GPU_BUSY_POLL_S = 0.002
"""A stealing worker held back by the encoder looks again this often (a shared-memory read)."""


class LLMWorker:
    def __init__(self, cfg: LLMWorkerConfig, redis: Redis, engine: ReferenceEngine,
                 receiver: EmbeddingReceiver, sender: EmbeddingSender, share: LLMGpuShare | None = None):
        self.cfg = cfg
        self.redis = redis
        self.keys = Keys(cfg.key_prefix)
        self.engine = engine
        self.receiver = receiver
        self.sender = sender
        self.registry = WorkerRegistry(redis, self.keys, cfg.heartbeat_ttl_s)
        self.jobs = JobStream(redis, self.keys, cfg.worker_id)
        self.handoff = KVHandoff(redis, self.keys, self.registry, sender)
        self.jobs_by_id: dict[str, PrefillJob | DecodeJob] = {}
        """Requests this worker answers for, from intake until their last token or hand-off."""
        self.pending: list[EngineRequest] = []
        self.aborted: set[str] = set()
        """Aborts to apply to the engine before its next step."""
        self.recent_aborts = RecentAborts()
        self.wake = asyncio.Event()
        self.publishing: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self.share = share
        """Set when this worker shares an encode GPU (cfg.colocated_with)."""

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.cfg.worker_id, role=self.cfg.role, tier=self.cfg.tier, host=socket.gethostname(),
            pid=os.getpid(), model=self.cfg.model_name, transport_address=self.receiver.address,
            colocated_with=self.cfg.colocated_with, started_at=time.time(),
        )

    async def run(self, stop: asyncio.Event) -> None:
        await self.receiver.start()
        await self.jobs.open()
        await self.fail_entries(await self.jobs.stranded(), "the worker restarted before finishing it")
        stats = self.share.metrics if self.share is not None else dict
        async with Presence(self.registry, self.info(), lambda: len(self.jobs_by_id), stats=stats):
            await supervise([forever("intake", self.intake_once, stop), forever("engine", self.engine_once, stop),
                             listen_aborts(self.redis, self.keys, self.abort)], stop)
        await self.fail_entries(await self.jobs.unread(), f"worker {self.cfg.worker_id} stopped")
        await self.fail_all(f"worker {self.cfg.worker_id} stopped")
        await self.jobs.delete()
        await self.sender.close()
        await self.receiver.close()
        self.report_share()

    def spawn(self, coro) -> None:
        """A fire-and-forget task, referenced until done (the loop keeps only weak references)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def intake_once(self) -> None:
        for entry_id, job in await self.jobs.read(64, block_ms=500):
            if isinstance(job, (PrefillJob, DecodeJob)) and job.request_id not in self.recent_aborts:
                self.jobs_by_id[job.request_id] = job
                self.spawn(self.admit(entry_id, job))
                continue
            if isinstance(job, AbortJob):
                self.abort(job.request_id)
            elif job is not None:  # a job whose abort overtook it
                self.spawn(self.receiver.discard(job.request_id))
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
                                    mm_embeddings=tensors.get("mm_embeds"), media=list(job.media))
            else:
                req = EngineRequest(job.request_id, job.prompt_token_ids, job.sampling,
                                    kv=tensors["kv"], output_token_ids=list(job.output_token_ids),
                                    rope_delta=job.rope_delta)
            self.pending.append(req)
            self.wake.set()
        except Exception as e:
            log.error("could not admit request", extra={"request_id": job.request_id, "error": str(e)})
            if self.jobs_by_id.pop(job.request_id, None) is not None:
                await self.publish_errors([job.request_id], f"{type(e).__name__}: {e}")
        finally:
            await self.jobs.ack(entry_id)

    def abort(self, request_id: str) -> None:
        self.recent_aborts.add(request_id)
        if self.jobs_by_id.pop(request_id, None) is not None:  # a step in flight will not publish it
            self.aborted.add(request_id)
            self.wake.set()
        self.spawn(self.receiver.discard(request_id))  # tensors that arrived for it, if any

    async def engine_once(self) -> None:
        """One step: admit, apply aborts, step in a thread, publish while the next step runs."""
        self.wake.clear()  # before looking for work, so an admit during the awaits below is not missed
        await self.admit_pending()
        for rid in self.aborted:
            self.engine.abort(rid)
        self.aborted.clear()
        self.report_share()
        if not self.engine.has_unfinished():
            await self.flush()
            self.report_share()  # the flushed publish may have finished requests
            if not self.pending:
                await self.wake.wait()
            return
        try:
            if self.share is None:
                outputs = await asyncio.to_thread(self.engine.step)
            elif (outputs := await asyncio.to_thread(self.share.run_step, self.engine.step)) is None:
                await asyncio.sleep(GPU_BUSY_POLL_S)  # the encoder has the GPU; look again shortly
                return
        except Exception as e:  # a failing step fails its requests, never the worker
            log.exception("engine step failed")
            await self.fail_all(f"engine step failed: {e}")
            return
        await self.flush()
        self.publishing = asyncio.create_task(self.emit(outputs))

    def report_share(self) -> None:
        """Tell the encoder on this GPU what its policies need: requests held (stealing), backlog (prefill)."""
        if self.share is not None:
            self.share.report(len(self.jobs_by_id), sum(
                len(j.prompt_token_ids) for j in self.jobs_by_id.values() if isinstance(j, PrefillJob)))

    async def flush(self) -> None:
        if self.publishing is not None:
            task, self.publishing = self.publishing, None
            await task

    async def admit_pending(self) -> None:
        """Hand queued requests to the engine; one it refuses fails alone, with the engine's reason."""
        pending, self.pending = self.pending, []
        for req in pending:
            try:
                self.engine.add(req)
            except ValueError as e:
                log.error("engine refused request", extra={"request_id": req.request_id, "error": str(e)})
                self.jobs_by_id.pop(req.request_id, None)
                await self.publish_errors([req.request_id], f"refused by {self.cfg.worker_id}: {e}")

    async def emit(self, outputs: list[StepOutput]) -> None:
        events = []
        for out in outputs:
            job = self.jobs_by_id.get(out.request_id)
            if job is None:
                continue
            timing = job.timing.model_copy(update={
                "prefill_s": job.timing.prefill_s + out.prefill_s, "decode_s": job.timing.decode_s + out.decode_s})
            if out.prefill_s:
                timing = timing.mark("first_token")
            if out.finished:
                timing = timing.mark("finished")
            job.timing = timing
            ev = TokenEvent(token_ids=out.new_token_ids, text=out.new_text, worker_id=self.cfg.worker_id,
                            batch_size=len(outputs),
                            logits=[base64.b64encode(l.float().numpy().tobytes()).decode() for l in out.logits])
            if out.handoff_kv is not None:
                self.spawn(self.hand_off(job, out))
            elif out.finished:
                ev.finish_reason, ev.prompt_tokens, ev.timing = out.finish_reason, len(job.prompt_token_ids), timing
                self.jobs_by_id.pop(out.request_id, None)
            events.append((out.request_id, ev))
        await publish_tokens(self.redis, self.keys, events)

    async def hand_off(self, job: PrefillJob, out: StepOutput) -> None:
        try:
            await self.handoff.send(job, list(out.new_token_ids), out.handoff_kv, self.recent_aborts.__contains__,
                                    out.handoff_rope_delta)
        except Exception as e:
            if job.request_id in self.jobs_by_id:
                await self.publish_errors([job.request_id], str(e))
        finally:
            self.jobs_by_id.pop(job.request_id, None)

    async def fail_all(self, reason: str) -> None:
        """Every request this worker holds fails with `reason` (a broken step, or the worker stopping)."""
        failed = list(self.jobs_by_id)
        for rid in failed:
            self.engine.abort(rid)
        self.jobs_by_id.clear()
        self.pending.clear()
        await self.publish_errors(failed, reason)

    async def fail_entries(self, entries: list, reason: str) -> None:
        """Answer jobs taken from the stream that this worker will never run, then ack them."""
        rids = [j.request_id for _, j in entries if isinstance(j, (PrefillJob, DecodeJob))]
        if rids:
            log.warning("failing jobs this worker cannot run", extra={"requests": rids, "reason": reason})
        await self.publish_errors(rids, reason)
        await self.jobs.ack(*[entry_id for entry_id, _ in entries])

    async def publish_errors(self, request_ids: list[str], reason: str) -> None:
        await publish_tokens(self.redis, self.keys, [
            (rid, TokenEvent(finish_reason="error", error=reason, worker_id=self.cfg.worker_id)) for rid in request_ids])
