"""The encode worker process: jobs in (over its job link, or from its job stream in Redis), embeddings out over the
transport.

Per loop: take one micro-batch (the coordinator's dispatch policy released it onto this worker's job link or
stream: job_inbox.py),
fetch the media, claim the GPU (gpu_share.py: at most one stolen step to wait for, then the SM split),
run the encoder once for the whole batch in a thread (so heartbeats keep flowing; the prompts of jobs the
coordinator sent before building them are popped meanwhile, prompts.py), then for each request send its
embeddings to the prefill-capable LLM worker routing.py picks (on a routing view kept fresh between batches)
and tell that worker on its job stream. Run-time knobs (s, stealing, SM partition) are re-read from Redis once a
second, by a loop of their own, off the requests' path.

On SIGTERM with `drain_timeout_s` (a plan switch or rolling restart retiring it) the worker drains like an LLM
worker: its registry record says draining, so the coordinator's dispatch (registry.alive) queues nothing new
for it; it finishes the micro-batches on its stream and those the dispatcher still held for it (a batch
policy holds a request at most `max_wait_s`, so the stream must stay empty that long), then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

import torch
from redis.asyncio import Redis

from coordinator.policies.base import PolicyConfig
from coordinator.protocol.addresses import may_listen_unauthenticated
from coordinator.protocol.colocation import ColocationChannel, channel_path
from coordinator.protocol.compute_thread import ComputeThread
from coordinator.protocol.delivery import DeliveryError, deliver, transfer_id
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import (
    EncodedMedia,
    EncodeJob,
    PrefillJob,
    WorkerInfo,
)
from coordinator.protocol.presence import Presence
from coordinator.protocol.process import forever, supervise
from coordinator.protocol.registry import WorkerRegistry, WorkerStatus
from coordinator.protocol.roles import PREFILLING
from coordinator.protocol.routing_view import RoutingView
from coordinator.protocol.streams import JobStream, event_for, hand_over, publish_tokens, reply_key
from encode_node.config import EncodeWorkerConfig
from encode_node.encoded import Encoder
from encode_node.gpu_share import EncoderGpuShare
from encode_node.job_inbox import JobInbox
from encode_node.prompts import PromptPop, fill, placeholder_tokens
from encode_node.routing import RequestRouter, Targets
from native.nvml import GpuTelemetry
from native.stream_partition import StreamPartition
from transport.registry import make_sender

log = logging.getLogger(__name__)
POLICY_REFRESH_S = 1.0
VIEW_REFRESH_S = 0.1
"""How often the routing view is scanned between batches (RoutingView.keep_fresh): a batch finds a view at most
this old (plus a scan) and reads no registry on its way; the loads in it change every heartbeat (0.5 s)."""
NO_LLM_WORKER = "no prefill or combined LLM worker is alive; start one (tierserve up --llm ...)"
DRAIN_POLL_S = 0.05
DRAIN_QUIET_MARGIN_S = 0.5
"""A draining worker stops once its stream has been empty for the batch policy's max_wait_s plus this."""


class EncodeWorker:
    def __init__(self, cfg: EncodeWorkerConfig, redis: Redis, encoder: Encoder):
        self.cfg = cfg
        self.redis = redis
        self.keys = Keys(cfg.key_prefix)
        self.encoder = encoder
        self.registry = WorkerRegistry(redis, self.keys, cfg.heartbeat_ttl_s)
        self.view = RoutingView(self.registry, max_age_s=2 * VIEW_REFRESH_S)
        """Where embeddings can go: scanned between batches, so no scan runs beside a forward (on its core,
        under its GIL: in a live probe it delayed the forward's start by ~0.3 ms and slowed it by ~0.25)."""
        self.jobs = JobStream(redis, self.keys, cfg.worker_id)
        self.inbox = JobInbox(redis, self.jobs,
                              cfg.cluster_secret.get_secret_value() if cfg.cluster_secret is not None else None)
        self.current: str | None = None
        """The stream entry of the batch being encoded (None: it came over the job link, or none is)."""
        self.sender = make_sender(cfg.transport, **cfg.sender_options())
        self.in_flight = 0
        self.queued_batches = 0
        """Micro-batches released to this worker but not taken yet, as last counted (a metric)."""
        self.router = RequestRouter(cfg.worker_id)
        self.channel = ColocationChannel(channel_path(cfg.key_prefix, cfg.worker_id))
        self.share = EncoderGpuShare(self.channel, StreamPartition(cfg.device, "encoder"))
        self.compute = ComputeThread(f"{cfg.worker_id}-encoder")
        """Where every encoder forward runs: one thread, not the default executor's."""
        self.batch_max_wait_s = PolicyConfig().batch.max_wait_s
        """The dispatcher's longest hold of a request (BatchPolicyConfig.max_wait_s), as last read."""
        self.telemetry = GpuTelemetry(cfg.device)
        """NVML readings of this worker's GPU for its heartbeats (native/nvml.py); none on a CPU."""
        self.info = WorkerInfo(
            worker_id=cfg.worker_id, role="encode", tier=cfg.tier, host=socket.gethostname(),
            pid=os.getpid(), model=cfg.model_name, started_at=time.time(),
            device=f"{cfg.device} {cfg.dtype}", gpu_telemetry=self.telemetry.reason,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop`. Requests this worker holds when it stops (or dies) are not failed here: the
        coordinator sees this instance leave the registry and re-runs them on a live encode worker."""
        dropped = await self.jobs.open()
        if dropped:
            log.warning("dropped jobs an earlier process of this worker left; the coordinator re-runs them",
                        extra={"entries": dropped})
        with contextlib.suppress(Exception):  # the knobs before the first batch; follow_policy retries
            await self.read_policy()
        host = self.cfg.transport_host or "127.0.0.1"
        if self.inbox.secret is not None or may_listen_unauthenticated(host, host):
            self.info = self.info.model_copy(update={"job_address": await self.inbox.listen(host)})
        else:
            log.warning("no job link: listening off loopback needs the cluster secret (TIERSERVE_CLUSTER_SECRET); "
                        "micro-batches come through Redis alone", extra={"host": host})
        async with Presence(self.registry, self.info, lambda: self.in_flight, stats=self.stats) as presence:
            halt = asyncio.Event()
            drain = asyncio.create_task(self.drain_on(stop, halt, presence))
            await supervise([forever("encode", self.encode_once, halt), self.follow_policy(halt),
                             forever("stream", self.inbox.read_stream_once, halt),
                             self.view.keep_fresh(VIEW_REFRESH_S)], halt)
            drain.cancel()
            await presence.leave()  # from here the coordinator re-runs what this worker still holds
        await self.inbox.close()
        await self.jobs.delete()
        await self.sender.close()
        self.channel.encoder_exit(False)
        self.channel.close()
        self.compute.close()

    async def drain_on(self, stop: asyncio.Event, halt: asyncio.Event, presence: Presence) -> None:
        """When `stop` comes, drain (cfg.drain_timeout_s): take no new work, finish what was released here, and
        halt once nothing is held and the stream has stayed empty past the dispatcher's longest hold, or the
        time is up (the coordinator re-runs what is left)."""
        await stop.wait()
        if self.cfg.drain_timeout_s > 0:
            await presence.drain()
            with contextlib.suppress(Exception):  # the current max_wait_s; the last one read otherwise
                await self.read_policy()
            await self.announce_if_idle()  # work-conserving policies release what they hold for it now
            now = time.monotonic()
            deadline, quiet_since = now + self.cfg.drain_timeout_s, None
            while now < deadline:
                try:
                    busy = self.in_flight > 0 or await self.inbox.waiting() > 0
                except Exception as e:  # Redis hiccup: keep draining until it answers or the time is up
                    log.warning("drain cannot read the job stream", extra={"error": str(e)})
                    busy = True
                if busy:
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= self.batch_max_wait_s + DRAIN_QUIET_MARGIN_S:
                    break
                await asyncio.sleep(DRAIN_POLL_S)
                now = time.monotonic()
            log.info("drained" if now < deadline else "drain timed out; the coordinator re-runs the rest",
                     extra={"held": self.in_flight})
        halt.set()

    async def encode_once(self) -> None:
        """One micro-batch (a stream entry or a link frame), as the coordinator's dispatch policy formed it."""
        if (got := await self.inbox.next(0.5)) is not None:
            self.current, jobs = got
            self.in_flight = len(jobs)
            batches = _one_modality_batches(jobs, self.cfg.max_batch_size)  # the cap guards memory, not policy
            i = 0
            try:
                for i, batch in enumerate(batches):
                    await self.encode_and_forward(batch)
            except Exception as e:  # e.g. Redis went away mid-batch: answer what is left, then let the loop retry
                with contextlib.suppress(Exception):
                    await self.fail([j for b in batches[i:] for j in b], f"encode worker error: {type(e).__name__}: {e}")
                raise
            finally:
                self.in_flight = 0
                entry_id, self.current = self.current, None
                self.queued_batches = await self.inbox.done(entry_id)
                if self.queued_batches == 0:
                    await self.announce_idle()

    async def announce_if_idle(self) -> None:
        """`announce_idle` if nothing is queued for this worker (a lost message only leaves the work-conserving
        policies' timing rule in charge). The count is also the queue metric's."""
        try:
            self.queued_batches = await self.inbox.waiting()
        except Exception as e:
            log.warning("could not announce an idle encoder", extra={"error": str(e)})
            return
        if self.queued_batches == 0:
            await self.announce_idle()

    async def announce_idle(self) -> None:
        """Tell the coordinator's work-conserving policies that this encoder has nothing left to do."""
        try:
            await self.redis.publish(self.keys.encoder_idle, self.cfg.worker_id)
        except Exception as e:
            log.warning("could not announce an idle encoder", extra={"error": str(e)})

    async def encode_and_forward(self, jobs: list[EncodeJob]) -> None:
        media = await self.fetch_media(jobs)
        ok = [(j, m) for j, m in zip(jobs, media) if m is not None]
        await self.fail([j for j, m in zip(jobs, media) if m is None], "media expired before encoding")
        if not ok:
            return
        tokens = sum(placeholder_tokens(j, self.encoder.placeholder_ids) for j, _ in ok)
        prompts = PromptPop(self.redis, [j for j, _ in ok])  # of jobs sent before their prompts (prompts.py)
        await prompts.send()
        ok = [(j.model_copy(update={"timing": j.timing.mark("encode_dequeued")}), m) for j, m in ok]
        def encode(jobs=ok):  # after the claim, in its thread: the forward runs on the stream it masked
            jobs = [(j.model_copy(update={"timing": j.timing.mark("encode_start")}), m) for j, m in jobs]
            return jobs, self.encoder.encode([m for _, m in jobs], jobs[0][0].modality)

        scan = self.prefill_targets()
        try:  # waits out a stolen step, if one runs
            _, (ok, batch) = await self.compute.run(self.share.run_batch, len(ok), tokens, encode)
        except Exception as e:
            scan.cancel()
            await prompts.close()
            log.exception("encode failed", extra={"batch": len(ok)})
            await self.fail([j for j, _ in ok], f"encoder failed: {e}")
            return
        finally:
            pending = await self.release_gpu(scan)
        ok = [(j.model_copy(update={"timing": j.timing.mark("encode_end", encode_batch=len(ok))}), m) for j, m in ok]
        log.info("encoded batch", extra={"batch": len(ok), "seconds": round(batch.seconds, 4)})
        for (j, _), err in zip(ok, batch.errors):
            if err is not None:
                await self.fail([j], err)
        ready, missing = await prompts.result()
        encoded = []
        for (j, _), emb, media in zip(ok, batch.per_request, batch.media):
            if emb is None:
                continue
            if (filled := fill(j, ready.get(j.request_id))) is not None:
                encoded.append((filled, emb, media))
            elif j.request_id not in ready:
                await self.fail([j], f"encoded, but {missing}")
        targets = Targets.sort(await scan, self.cfg.worker_id)
        held = self.channel.stolen_held() + (await self.redis.xlen(self.keys.jobs(targets.steal[0].info.worker_id))
                                             if targets.steal else 0)
        now = time.monotonic()
        self.router.observe(targets, self.queued_batches if pending is None else pending, held, now)
        chosen = [(j, emb, media, self.router.choose(j, targets, now)) for j, emb, media in encoded]
        # Each request waited for the whole batch: charge it the batch's wall time (latency view).
        # The fallbacks if a chosen worker fails: remote workers, least loaded first (never a stealing one).
        others = sorted(targets.remote or targets.local, key=lambda w: w.load)
        await asyncio.gather(*(self.forward(j, emb, media, batch.seconds, target, others)
                               for j, emb, media, target in chosen))

    def prefill_targets(self) -> asyncio.Future[list[WorkerStatus]]:
        """Where a batch's embeddings can go, read beside its forward: the view kept fresh between batches, at
        once; a scan of its own only when the view is older than its stale limit (Redis was away) or empty (no
        LLM worker yet)."""
        scan = asyncio.ensure_future(self.view.alive(PREFILLING))
        scan.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure unread on an early exit
        return scan

    async def release_gpu(self, scan: asyncio.Future) -> int | None:
        """Hand the GPU back after a forward; returns the micro-batches queued behind this one, or None when they
        were not counted. Only an LLM worker on this encoder's GPU (a local prefill or a stealing worker, seen
        in this batch's scan, or any while the scan cannot say) acts on the count: it is read first then, a
        Redis round trip before the embeddings leave; without one the count is skipped (the batch's ack counts
        after it, for the metric and the idle announcement)."""
        if _shares_gpu(scan, self.cfg.worker_id):
            pending = self.queued_batches = await self.pending_batches()
            self.share.release(pending > 0)
            return pending
        self.share.release(False)
        return None

    async def pending_batches(self) -> int:
        """Micro-batches queued behind the one being encoded (entries are deleted when acked); 0 when
        Redis cannot say (the GPU is handed back either way; the loop's next read will surface it)."""
        try:
            return max(0, await self.inbox.waiting() - (self.current is not None))
        except Exception as e:
            log.warning("could not count queued micro-batches", extra={"error": str(e)})
            return 0

    async def fetch_media(self, jobs: list[EncodeJob]) -> list[list[bytes] | None]:
        """Each job's media bytes, None for a job whose stored media expired: from the job where it carries them
        (a first run's small media), else from Redis, in one round trip for the whole batch."""
        stored = [ref.key for j in jobs for ref in j.media if ref.data is None]
        fetched = iter([])
        if stored:
            pipe = self.redis.pipeline(transaction=False)
            for key in stored:
                pipe.get(key)
            fetched = iter(await pipe.execute())
        out = []
        for j in jobs:
            chunk = [ref.data if ref.data is not None else next(fetched) for ref in j.media]
            out.append(None if any(c is None for c in chunk) else chunk)
        return out

    async def follow_policy(self, stop: asyncio.Event) -> None:
        """Pick up knobs set through the admin endpoint: one GET a second until `stop`, never in a batch's way.
        While Redis is away the knobs last read stay."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), POLICY_REFRESH_S)
            try:
                await self.read_policy()
            except Exception as e:
                log.warning("could not read the policy; keeping the last one", extra={"error": str(e)})

    async def read_policy(self) -> None:
        raw = await self.redis.get(self.keys.policy)
        if raw:
            policy = PolicyConfig.model_validate_json(raw)
            self.share.config = policy.partition
            self.batch_max_wait_s = policy.batch.max_wait_s
            if self.router.configure(policy):
                log.info("policy changed", extra={"s": policy.offload.s, "stealing": policy.stealing.enabled})

    def stats(self) -> dict[str, float]:
        return (self.router.stats() | self.share.metrics() | {"encode_queue_batches": float(self.queued_batches)}
                | self.telemetry.read())

    async def forward(self, job: EncodeJob, emb: torch.Tensor, media: list[EncodedMedia], encode_s: float,
                      target: WorkerStatus | None, others: list[WorkerStatus]) -> None:
        if target is None and (target := await self.choose_again(job)) is None:
            await self.fail([job], NO_LLM_WORKER)
            return
        t0 = time.perf_counter()
        candidates = [target, *[w for w in others if w is not target]]
        try:  # the chosen worker first; if it fails (died, hangs), the least loaded of the others
            target, descs = await deliver(self.sender, candidates, transfer_id(job.request_id, job.attempt),
                                          {"mm_embeds": emb}, lambda ws: ws[0] if ws else None)
        except DeliveryError as e:
            if (sent := await self.redeliver(job, emb, {w.info.worker_id for w in candidates}, e)) is None:
                return
            target, descs = sent
        timing = job.timing.mark("embeddings_sent", encode_s=encode_s, transfer_s=time.perf_counter() - t0)
        prefill = PrefillJob(
            request_id=job.request_id, prompt_token_ids=job.prompt_token_ids, sampling=job.sampling,
            arrival=job.arrival, timing=timing, embeddings=descs, media=media, attempt=job.attempt,
            reply_to=job.reply_to, reply_addr=job.reply_addr, output_token_ids=job.output_token_ids,
        )
        await hand_over(self.redis, self.keys, target.info.holder, prefill, reply_key(self.keys, job))

    async def choose_again(self, job: EncodeJob) -> WorkerStatus | None:
        """No worker in the batch's view fits the job (none at all, or not the one it is pinned to): the view may be
        a refresh old, and a worker registered since. Choose on a fresh scan; None if none fits there either."""
        try:
            fresh = Targets.sort(await self.view.rescan(PREFILLING), self.cfg.worker_id)
        except Exception:  # Redis away: no worker to name
            return None
        return self.router.choose(job, fresh, time.monotonic())

    async def redeliver(self, job: EncodeJob, emb: torch.Tensor, tried: set[str], error: DeliveryError
                        ) -> tuple[WorkerStatus, list] | None:
        """Every worker the batch's view offered failed. The view may be a refresh old and one in it dead since:
        scan again, send to live workers not tried yet, and with none alive fail the request saying so. None when
        the request failed (answered with the reason)."""
        try:
            alive = Targets.sort(await self.view.rescan(PREFILLING), self.cfg.worker_id)
        except Exception:  # Redis away: the delivery's own failure is the reason
            await self.fail([job], f"sending embeddings failed: {error}")
            return None
        if not alive.every:
            await self.fail([job], NO_LLM_WORKER)
            return None
        untried = sorted((w for w in alive.remote or alive.local if w.info.worker_id not in tried), key=lambda w: w.load)
        try:
            return await deliver(self.sender, untried, transfer_id(job.request_id, job.attempt), {"mm_embeds": emb},
                                 lambda ws: ws[0] if ws else None)
        except DeliveryError as e:
            await self.fail([job], f"sending embeddings failed: {error}" + ("" if not untried else f"; then {e}"))
            return None

    async def fail(self, jobs: list[EncodeJob], reason: str) -> None:
        if jobs:
            log.error("requests failed", extra={"requests": [j.request_id for j in jobs], "reason": reason})
            await publish_tokens(self.redis, [
                (reply_key(self.keys, j), event_for(j, finish_reason="error", error=reason, worker_id=self.cfg.worker_id))
                for j in jobs
            ])


def _one_modality_batches(jobs: list[EncodeJob], cap: int) -> list[list[EncodeJob]]:
    """Batches of at most `cap` jobs of one modality each, in arrival order within a modality (the
    dispatcher already releases one modality per micro-batch; this only guards the encoder)."""
    by_modality: dict[str, list[EncodeJob]] = {}
    for j in jobs:
        by_modality.setdefault(j.modality, []).append(j)
    return [group[i : i + cap] for group in by_modality.values() for i in range(0, len(group), cap)]


def _shares_gpu(scan: asyncio.Future, encoder_id: str) -> bool:
    """Whether an LLM worker runs on this encoder's GPU, by a finished scan of the live workers; True (act as if
    one did) while the scan is running or failed."""
    if not scan.done() or scan.cancelled() or scan.exception() is not None:
        return True
    return any(w.info.colocated_with == encoder_id for w in scan.result())
