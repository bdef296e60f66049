"""Per-encode-worker micro-batch queues, released onto the workers' job streams by a policy object.

The policy (coordinator/policies) decides when; this module only keeps the FIFO, asks at every
arrival and at the policy's deadline, and writes each released micro-batch as ONE stream entry, so
the encode worker runs exactly the batch the policy formed.
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
from coordinator.protocol.messages import EncodeBatch, EncodeJob
from coordinator.protocol.streams import FIELD

log = logging.getLogger(__name__)


class EncodeDispatcher:
    def __init__(self, redis: Redis, keys: Keys, config: BatchPolicyConfig,
                 make_policy: Callable[[BatchPolicyConfig], BatchPolicy], metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.redis = redis
        self.keys = keys
        self.config = config
        self.make_policy = make_policy
        self.metrics = metrics
        self.clock = clock
        self.queues: dict[str, deque[EncodeJob]] = {}
        self.policies: dict[str, BatchPolicy] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self._polls: set[asyncio.Task] = set()

    async def submit(self, worker_id: str, job: EncodeJob) -> None:
        if worker_id not in self.policies:
            self.policies[worker_id] = self.make_policy(self.config)
        self.queues.setdefault(worker_id, deque()).append(job)
        self.policies[worker_id].observe(Arrival(job.request_id), self.clock())
        await self.poll(worker_id)

    async def reconfigure(self, config: BatchPolicyConfig) -> None:
        """Apply new knobs: what is queued goes out now (in batches of at most the old B), then the
        next arrival of each worker starts a fresh policy."""
        old, self.config = self.config, config
        for worker_id, queue in self.queues.items():
            while queue:
                await self._release(worker_id, [queue.popleft() for _ in range(min(old.max_batch, len(queue)))])
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()
        self.policies.clear()

    async def poll(self, worker_id: str) -> None:
        policy, queue = self.policies[worker_id], self.queues[worker_id]
        now = self.clock()
        batches = [[queue.popleft() for _ in range(min(r.count, len(queue)))] for r in policy.decide(now)]
        self._observe(worker_id, policy, len(queue))
        self._arm(worker_id, policy.next_deadline(now), now)
        for batch in batches:
            if batch:
                await self._release(worker_id, batch)

    async def _release(self, worker_id: str, batch: list[EncodeJob]) -> None:
        await self.redis.xadd(self.keys.jobs(worker_id), {FIELD: EncodeBatch(jobs=batch).model_dump_json()})
        if self.metrics is not None:
            self.metrics.encode_batch.observe(len(batch))

    def _observe(self, worker_id: str, policy: BatchPolicy, queued: int) -> None:
        if self.metrics is None:
            return
        self.metrics.dispatch_queue.labels(worker_id).set(queued)
        rate, g = getattr(policy, "rate", None), getattr(policy, "idle_threshold", None)
        if rate is not None:
            self.metrics.arrival_rate.labels(worker_id).set(rate)
        if g is not None:
            self.metrics.idle_threshold.labels(worker_id).set(g)

    def _arm(self, worker_id: str, deadline: float | None, now: float) -> None:
        old = self.timers.pop(worker_id, None)
        if old is not None:
            old.cancel()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self.timers[worker_id] = loop.call_later(max(0.0, deadline - now), self._poll_later, worker_id)

    def _poll_later(self, worker_id: str) -> None:
        if worker_id not in self.policies:  # reconfigured meanwhile
            return
        task = asyncio.ensure_future(self.poll(worker_id))
        self._polls.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._polls.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("deadline release failed", extra={"error": str(task.exception())})

    def close(self) -> None:
        for t in self.timers.values():
            t.cancel()
        self.timers.clear()
