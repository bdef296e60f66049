"""Per-(encode worker, modality) micro-batch queues, released to the workers by policies: over a worker's job link
when one is up (coordinator/protocol/links.py), else onto its job stream.

The policy (coordinator/policies) decides when; this module only keeps the FIFOs, asks at every
arrival, at the policy's deadline and when the worker says it ran out of work (`encoder_idle`, for
work-conserving policies), and writes each released micro-batch as ONE stream entry or link frame, so
the encode worker runs exactly the batch the policy formed. A micro-batch holds one modality (one
encoder path, one forward), so each worker has one queue and one policy instance per modality: the
policy sees that modality's arrival rate, which is what its batch timing is about.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from redis.asyncio import Redis

from coordinator.metrics import Metrics
from coordinator.policies.base import Arrival, BatchPolicy, BatchPolicyConfig
from coordinator.protocol.keys import Keys
from coordinator.protocol.links import Links
from coordinator.protocol.messages import EncodeBatch, EncodeJob, Modality
from coordinator.protocol.streams import FIELD

log = logging.getLogger(__name__)
RETRY_S = 0.25
"""A release Redis refused is tried again after this long."""
QueueKey = tuple[str, Modality]
"""(encode worker id, modality): one FIFO, one policy, one deadline timer."""


class EncodeDispatcher:
    def __init__(self, redis: Redis, keys: Keys, config: BatchPolicyConfig,
                 make_policy: Callable[[BatchPolicyConfig], BatchPolicy], metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic, links: Links | None = None):
        self.redis = redis
        self.keys = keys
        self.config = config
        self.make_policy = make_policy
        self.metrics = metrics
        self.clock = clock
        self.queues: dict[QueueKey, deque[EncodeJob]] = {}
        self.policies: dict[QueueKey, BatchPolicy] = {}
        self.timers: dict[QueueKey, asyncio.TimerHandle] = {}
        self._polls: set[asyncio.Task] = set()
        self.links = links
        """The coordinator's job links; None: every batch goes onto the stream."""
        self.addresses: dict[str, str] = {}
        """Each encode worker's job link address, as its registry record gave it when a job was submitted."""

    async def submit(self, worker_id: str, job: EncodeJob, address: str = "") -> None:
        """Queue `job` for the worker; `address`: its job link (WorkerInfo.job_address), "" for none."""
        self.addresses[worker_id] = address
        key = (worker_id, job.modality)
        if key not in self.policies:
            self.policies[key] = self.make_policy(self.config)
        self.queues.setdefault(key, deque()).append(job)
        self.policies[key].observe(Arrival(job.request_id), self.clock())
        await self.poll(key)

    def encoder_idle(self, worker_id: str) -> None:
        """The worker's job stream ran empty (its pub/sub signal): let its policies release what waits."""
        now = self.clock()
        for key in [k for k in self.policies if k[0] == worker_id]:
            self.policies[key].encoder_idle(now)
            self._poll_later(key)

    async def reconfigure(self, config: BatchPolicyConfig) -> None:
        """Apply new knobs: what is queued goes out now (in batches of at most the old B), then the
        next arrival of each worker starts a fresh policy."""
        old, self.config = self.config, config
        for key, queue in self.queues.items():
            while queue:
                await self._release(key, [queue.popleft() for _ in range(min(old.max_batch, len(queue)))])
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()
        self.policies.clear()

    async def poll(self, key: QueueKey) -> None:
        policy, queue = self.policies[key], self.queues[key]
        now = self.clock()
        batches = [[queue.popleft() for _ in range(min(r.count, len(queue)))] for r in policy.decide(now)]
        self._observe(key, policy)
        self._arm(key, policy.next_deadline(now), now)
        for n, batch in enumerate(batches):
            if not batch:
                continue
            try:
                await self._release(key, batch)
            except Exception:
                # Redis refused the write (down, restarting): nothing is lost; what was not written goes back
                # to the head of the queue and is tried again shortly.
                for job in reversed([j for b in batches[n:] for j in b]):
                    queue.appendleft(job)
                self._arm(key, self.clock() + RETRY_S, self.clock())
                raise

    async def _release(self, key: QueueKey, batch: list[EncodeJob]) -> None:
        body = EncodeBatch(jobs=batch).model_dump_json()
        direct = 0
        if self.links is not None:
            direct = await self.links.publish([(self.keys.jobs(key[0]), self.addresses.get(key[0]) or None,
                                                body.encode())])
        else:
            await self.redis.xadd(self.keys.jobs(key[0]), {FIELD: body})
        if self.metrics is not None:
            self.metrics.encode_batch.observe(len(batch))
            self.metrics.link_writes.labels("job", "direct" if direct else "stream").inc()

    def _observe(self, key: QueueKey, policy: BatchPolicy) -> None:
        """Queue length per worker (all modalities); rate and g of the modality's policy, labelled
        "worker" for images (as before modalities existed) and "worker/modality" otherwise."""
        if self.metrics is None:
            return
        worker_id, modality = key
        self.metrics.dispatch_queue.labels(worker_id).set(
            sum(len(q) for (w, _), q in self.queues.items() if w == worker_id))
        label = worker_id if modality == "image" else f"{worker_id}/{modality}"
        rate, g = getattr(policy, "rate", None), getattr(policy, "idle_threshold", None)
        if rate is not None:
            self.metrics.arrival_rate.labels(label).set(rate)
        if g is not None:
            self.metrics.idle_threshold.labels(label).set(g)

    def _arm(self, key: QueueKey, deadline: float | None, now: float) -> None:
        old = self.timers.pop(key, None)
        if old is not None:
            old.cancel()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self.timers[key] = loop.call_later(max(0.0, deadline - now), self._poll_later, key)

    def _poll_later(self, key: QueueKey) -> None:
        if key not in self.policies:  # reconfigured meanwhile
            return
        task = asyncio.ensure_future(self.poll(key))
        self._polls.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._polls.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("deadline release failed", extra={"error": str(task.exception())})

    def forget(self, worker_id: str) -> None:
        """Drop a dead worker's queues, policies and timers; its requests are re-run by the failover (their
        holder is that worker), not released here."""
        self.addresses.pop(worker_id, None)
        for key in [k for k in self.policies.keys() | self.queues.keys() if k[0] == worker_id]:
            self.policies.pop(key, None)
            self.queues.pop(key, None)
            handle = self.timers.pop(key, None)
            if handle is not None:
                handle.cancel()

    def forget_all(self) -> None:
        for worker_id in {k[0] for k in self.policies.keys() | self.queues.keys()}:
            self.forget(worker_id)

    def close(self) -> None:
        for t in self.timers.values():
            t.cancel()
        self.timers.clear()
