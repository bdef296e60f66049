"""The LLM worker process: prefill/decode jobs in, tokens out (over each coordinator's direct reply link, or
through Redis: coordinator/protocol/links.py), KV out over the transport.

Three supervised loops share the engine: intake turns job messages plus the tensors they name into
engine requests; the engine loop runs `engine.step()` in a thread (the event loop stays free for
transfers and heartbeats) and publishes each step's tokens (one write per coordinator) while the next step
computes; the abort listener drops requests whose client left. A worker on an encode GPU steps
through its `LLMGpuShare` (gpu_share.py): a stealing worker only while the encoder is idle. Requests and aborts enter the engine
only between steps, so the engine needs no locks. A request this worker cannot finish because it stops
or dies is not failed here: the coordinator sees this instance leave the registry and re-runs the request
elsewhere, continuing after the tokens already streamed. Intake is bounded (`max_held`): past it, jobs
wait in this worker's Redis stream and its reported load includes them, so routing goes elsewhere.
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

from coordinator.protocol.aborts import RecentAborts, listen_aborts, parse_abort
from coordinator.protocol.compute_thread import ComputeThread
from coordinator.protocol.delivery import transfer_id
from coordinator.protocol.keys import Keys
from coordinator.protocol.links import Links
from coordinator.protocol.logprobs import PackedLogprobs
from coordinator.protocol.messages import AbortJob, DecodeJob, PrefillJob, TokenEvent, WorkerInfo, new_instance
from coordinator.protocol.presence import Presence
from coordinator.protocol.process import forever, supervise
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.streams import (
    JobStream, by_stream, event_for, event_list, publish_entries, reply_address, reply_key)
from llm_node.config import LLMWorkerConfig
from llm_node.engine_api import Engine, EngineRequest, StepOutput
from llm_node.gpu_share import LLMGpuShare
from llm_node.handoff import HandoffError, KVHandoff
from native.nvml import GpuTelemetry
from transport.base import EmbeddingReceiver, EmbeddingSender

log = logging.getLogger(__name__)
GPU_BUSY_POLL_S = 0.002
"""A stealing worker held back by the encoder looks again this often (a shared-memory read)."""


class LLMWorker:
    def __init__(self, cfg: LLMWorkerConfig, redis: Redis, engine: Engine,
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
        self.replies = Links(lambda entries: publish_entries(redis, entries), cfg.worker_id,
                             cfg.cluster_secret.get_secret_value() if cfg.cluster_secret is not None else None)
        """Where token events go: each coordinator's reply link while it is up, else its reply stream (links.py)."""
        self.telemetry = GpuTelemetry(cfg.device)
        """NVML readings of this worker's GPU for its heartbeats (native/nvml.py); none on a CPU."""
        self.jobs_by_id: dict[str, PrefillJob | DecodeJob] = {}
        """Requests this worker answers for, from intake until their last token or hand-off."""
        self.pending: list[tuple[PrefillJob | DecodeJob, EngineRequest]] = []
        self.aborted: set[str] = set()
        """Aborts to apply to the engine before its next step."""
        self.recent_aborts = RecentAborts()
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        """Set when a held request leaves: intake may take more."""
        self.backlog = 0
        """Jobs waiting in this worker's stream while intake is full, as last counted."""
        self.streamed: dict[str, int] = {}
        """Output tokens of each held request so far (TokenEvent.index of its next event)."""
        self.publishing: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self.share = share
        """Set when this worker shares an encode GPU (cfg.colocated_with)."""
        self.compute = ComputeThread(f"{cfg.worker_id}-engine")
        """Where every engine call that computes (add, step) runs: one thread, not the default executor's."""
        self.instance = new_instance()
        """This process's WorkerInfo.instance (info() is rebuilt once the receiver knows its address)."""

    @property
    def max_held(self) -> int:
        return self.cfg.max_held or 2 * self.cfg.max_num_seqs

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.cfg.worker_id, role=self.cfg.role, tier=self.cfg.tier, host=socket.gethostname(),
            pid=os.getpid(), model=self.cfg.model_name, transport_address=self.receiver.address,
            colocated_with=self.cfg.colocated_with, started_at=time.time(), instance=self.instance,
            device=f"{self.cfg.device} {self.cfg.dtype}", gpu_telemetry=self.telemetry.reason,
        )

    def load(self) -> int:
        return len(self.jobs_by_id) + self.backlog

    async def run(self, stop: asyncio.Event) -> None:
        await self.receiver.start()
        dropped = await self.jobs.open()
        if dropped:
            log.warning("dropped jobs an earlier process of this worker left; the coordinator re-runs them",
                        extra={"entries": dropped})
        share = self.share.metrics if self.share is not None else dict

        def stats() -> dict[str, float]:  # reported with each heartbeat: /metrics shows them per worker
            return (share() | {f"transport_{k}": float(v) for k, v in self.receiver.stats().as_dict().items()}
                    | self.telemetry.read())
        async with Presence(self.registry, self.info(), self.load, stats=stats) as presence:
            halt = asyncio.Event()
            drain = asyncio.create_task(self.drain_on(stop, halt, presence))
            await supervise([forever("intake", self.intake_once, halt), forever("engine", self.engine_once, halt),
                             listen_aborts(self.redis, self.keys, self.abort)], halt)
            drain.cancel()
            await presence.leave()  # from here the coordinator re-runs what this worker still holds
        if self.jobs_by_id:
            log.warning("stopping with requests in flight; the coordinator re-runs them",
                        extra={"requests": list(self.jobs_by_id)})
        await self.jobs.delete()
        await self.replies.close()
        await self.sender.close()
        await self.receiver.close()
        self.compute.close()
        self.report_share()

    async def drain_on(self, stop: asyncio.Event, halt: asyncio.Event, presence: Presence) -> None:
        """When `stop` comes, drain (cfg.drain_timeout_s): routing sends nothing new, intake still takes what was
        routed here before, and the loops halt once nothing is held or waiting, or the time is up."""
        await stop.wait()
        if self.cfg.drain_timeout_s > 0:
            await presence.drain()
            deadline = time.monotonic() + self.cfg.drain_timeout_s
            while time.monotonic() < deadline and (self.jobs_by_id or await self.jobs.waiting()):
                await asyncio.sleep(0.1)
            log.info("drained" if not self.jobs_by_id else "drain timed out; the coordinator re-runs the rest",
                     extra={"requests": list(self.jobs_by_id)})
        halt.set()

    def spawn(self, coro) -> None:
        """A fire-and-forget task, referenced until done (the loop keeps only weak references)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def intake_once(self) -> None:
        room = self.max_held - len(self.jobs_by_id)
        if room <= 0:  # full: leave jobs in the stream (they count in the load routing sees)
            self.room.clear()
            self.backlog = await self.jobs.waiting()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.room.wait(), 0.5)
            return
        self.backlog = 0
        for entry_id, job in await self.jobs.read(min(64, room), block_ms=500):
            if isinstance(job, (PrefillJob, DecodeJob)) and not self.recent_aborts.covers(job.request_id, job.attempt):
                old = self.jobs_by_id.get(job.request_id)
                if old is not None and old.attempt < job.attempt:  # a re-run reached the worker of an old run
                    self.aborted.add(job.request_id)
                self.jobs_by_id[job.request_id] = job
                self.spawn(self.admit(entry_id, job))
                continue
            if isinstance(job, AbortJob):
                self.abort(job.request_id)
            elif job is not None:  # a job whose abort overtook it
                self.spawn(self.receiver.discard(transfer_id(job.request_id, job.attempt)))
            await self.jobs.ack(entry_id)

    async def admit(self, entry_id: str, job: PrefillJob | DecodeJob) -> None:
        """Wait for the job's tensors, then queue it for the engine (acked only once it is queued)."""
        try:
            names = job.embeddings if isinstance(job, PrefillJob) else job.kv
            tensors = await self.receiver.recv(names, self.cfg.recv_timeout_s) if names else {}
            if self.jobs_by_id.get(job.request_id) is not job:  # aborted while its tensors were in flight
                return
            job.timing = job.timing.mark("admitted" if isinstance(job, PrefillJob) else "decode_admitted")
            self.streamed[job.request_id] = len(job.output_token_ids)
            if isinstance(job, PrefillJob):
                req = EngineRequest(job.request_id, job.prompt_token_ids, job.sampling,
                                    mm_embeddings=tensors.get("mm_embeds"), media=list(job.media),
                                    output_token_ids=list(job.output_token_ids))
            else:
                req = EngineRequest(job.request_id, job.prompt_token_ids, job.sampling,
                                    kv=tensors.get("kv"), output_token_ids=list(job.output_token_ids),
                                    rope_delta=job.rope_delta, media=list(job.media),
                                    kv_transfer_params=job.kv_transfer_params)
            self.pending.append((job, req))
            self.wake.set()
        except Exception as e:
            log.error("could not admit request", extra={"request_id": job.request_id, "error": str(e)})
            if self.release(job.request_id, job):
                await self.publish_errors([job], f"{type(e).__name__}: {e}")
        finally:
            await self.jobs.ack(entry_id)

    def release(self, request_id: str, job=None) -> bool:
        """Stop answering for the request (for `job`, only if it is still the one held); True if it was held."""
        held = self.jobs_by_id.get(request_id)
        if held is None or (job is not None and held is not job):
            return False
        del self.jobs_by_id[request_id]
        self.streamed.pop(request_id, None)
        self.room.set()
        return True

    def abort(self, message: str) -> None:
        """An abort from the channel: every attempt of a request ("rid"), or those up to N ("rid#N")."""
        request_id, up_to = parse_abort(message)
        self.recent_aborts.add(request_id, up_to)
        held = self.jobs_by_id.get(request_id)
        if held is not None and held.attempt <= up_to and self.release(request_id):
            self.aborted.add(request_id)  # a step in flight will not publish it
            self.wake.set()
            # tensors that arrived for the attempt it held, if any; a re-run's travel under another id
            self.spawn(self.receiver.discard(transfer_id(request_id, held.attempt)))

    async def engine_once(self) -> None:
        """One step: apply aborts, admit, step in a thread, publish while the next step runs."""
        self.wake.clear()  # before looking for work, so an admit during the awaits below is not missed
        for rid in self.aborted:
            self.engine.abort(rid)
        self.aborted.clear()
        adds = self.take_pending()
        if adds and self.share is not None:  # a shared GPU steps through its share: the adds go first, alone
            await self.refuse(await self.compute.run(self._add_all, adds))
            adds = []
        self.report_share()
        if not adds and not self.engine.has_unfinished():
            await self.flush()
            self.report_share()  # the flushed publish may have finished requests
            if not self.pending:
                await self.wake.wait()
            return
        refused: list = []
        try:
            if self.share is None:  # the adds and the step in one hop to the compute thread, not two
                refused, outputs = await self.compute.run(self._add_and_step, adds)
            elif (outputs := await self.compute.run(self.share.run_step, self.engine.step)) is None:
                await asyncio.sleep(GPU_BUSY_POLL_S)  # the encoder has the GPU; look again shortly
                return
        except Exception as e:  # the engine fails a request that breaks a step alone; this is a bug beyond that
            log.exception("engine step failed")
            await self.fail_all(f"engine step failed: {e}")
            return
        await self.refuse(refused)
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

    def take_pending(self) -> list[tuple[PrefillJob | DecodeJob, EngineRequest]]:
        """The queued requests still held (an abort may have dropped some), taken off the queue."""
        pending, self.pending = self.pending, []
        return [(job, req) for job, req in pending if self.jobs_by_id.get(req.request_id) is job]

    async def refuse(self, refused: list) -> None:
        """Fail each request the engine refused (a (job, request, error) of `_add_all`) alone, with its reason."""
        for job, req, e in refused:
            log.error("engine refused request", extra={"request_id": req.request_id, "error": str(e)})
            self.release(req.request_id)
            await self.publish_errors([job], f"refused by {self.cfg.worker_id}: {e}")

    def _add_all(self, ready: list) -> list:
        """engine.add each request; the (job, request, error) of those it refused. Off the event loop, like
        step(): vLLM processes a request's inputs in add(), and its first multimodal request takes seconds
        there, longer than the heartbeat TTL (the worker would be reaped as dead)."""
        refused = []
        for job, req in ready:
            try:
                self.engine.add(req)
            except ValueError as e:
                refused.append((job, req, e))
        return refused

    def _add_and_step(self, ready: list) -> tuple[list, list[StepOutput]]:
        """`_add_all`, then a step if anything is left to run: what the compute thread does for one engine_once."""
        refused = self._add_all(ready)
        return refused, self.engine.step() if self.engine.has_unfinished() else []

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
            index = self.streamed.get(out.request_id, 0)
            self.streamed[out.request_id] = index + len(out.new_token_ids)
            ev = event_for(job, index=index, token_ids=out.new_token_ids, text=out.new_text, worker_id=self.cfg.worker_id,
                           batch_size=len(outputs),
                           logits=[base64.b64encode(l.float().numpy().tobytes()).decode() for l in out.logits],
                           logprobs=PackedLogprobs.pack(out.logprobs) if out.logprobs else None)
            if out.handoff_kv is not None or out.handoff_params is not None:
                self.spawn(self.hand_off(job, out))
            elif out.finished:
                ev.finish_reason, ev.prompt_tokens, ev.timing = out.finish_reason, len(job.prompt_token_ids), timing
                ev.error = out.error
                self.release(out.request_id)
            events.append((job, ev))
        await self.publish(events)

    async def publish(self, events: list[tuple[PrefillJob | DecodeJob, TokenEvent]]) -> None:
        """Each job's events to its coordinator, one write per coordinator, in order."""
        keyed, link = [], {}
        for job, ev in events:
            key = reply_key(self.keys, job)
            link.setdefault(key, reply_address(self.keys, job))
            keyed.append((key, ev))
        await self.replies.publish([(key, link[key], event_list(evs)) for key, evs in by_stream(keyed).items()])

    async def hand_off(self, job: PrefillJob, out: StepOutput) -> None:
        try:
            await self.handoff.send(job, list(out.handoff_output_ids), out.handoff_kv,
                                    lambda j: self.recent_aborts.covers(j.request_id, j.attempt),
                                    out.handoff_rope_delta, out.handoff_params)
        except Exception as e:  # HandoffError, or Redis failing past its retries
            if self.jobs_by_id.get(job.request_id) is job:
                with contextlib.suppress(Exception):  # Redis down: the coordinator fails it after a few seconds
                    await self.publish_errors([job], str(e) if isinstance(e, HandoffError) else
                                              f"KV handoff failed: {type(e).__name__}: {e}")
        finally:
            self.release(job.request_id, job)

    async def fail_all(self, reason: str) -> None:
        """Every request this worker holds fails with `reason` (a step broke beyond one request's fault)."""
        failed = list(self.jobs_by_id.values())
        for job in failed:
            self.engine.abort(job.request_id)
            self.release(job.request_id)
        self.pending.clear()
        await self.publish_errors(failed, reason)

    async def publish_errors(self, jobs: list[PrefillJob | DecodeJob], reason: str) -> None:
        await self.publish([(j, event_for(j, finish_reason="error", error=reason, worker_id=self.cfg.worker_id))
                            for j in jobs])
