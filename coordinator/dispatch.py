"""Per-encode-worker micro-batch queues, released onto the workers' job streams by a policy object."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from redis.asyncio import Redis

from coordinator.policies.base import Arrival, BatchPolicy
from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import EncodeJob
from coordinator.protocol.streams import FIELD

log = logging.getLogger(__name__)


class EncodeDispatcher:
    """Holds each encode worker's open batch; asks its policy on every arrival and at its deadline."""

    def __init__(self, redis: Redis, keys: Keys, make_policy: Callable[[], BatchPolicy],
                 clock: Callable[[], float] = time.monotonic):
        self.redis = redis
        self.keys = keys
        self.make_policy = make_policy
        self.clock = clock
        self.queues: dict[str, deque[EncodeJob]] = {}
        self.policies: dict[str, BatchPolicy] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self._polls: set[asyncio.Task] = set()

    async def submit(self, worker_id: str, job: EncodeJob) -> None:
        policy = self.policies.get(worker_id) or self.policies.setdefault(worker_id, self.make_policy())
        self.queues.setdefault(worker_id, deque()).append(job)
        policy.observe(Arrival(job.request_id), self.clock())
        await self.poll(worker_id)

    async def poll(self, worker_id: str) -> None:
        policy, queue = self.policies[worker_id], self.queues[worker_id]
        now = self.clock()
        for release in policy.decide(now):
            batch = [queue.popleft() for _ in range(min(release.count, len(queue)))]
            pipe = self.redis.pipeline(transaction=False)
            for job in batch:
                pipe.xadd(self.keys.jobs(worker_id), {FIELD: job.model_dump_json()})
            await pipe.execute()
        self._arm(worker_id, policy.next_deadline(now), now)

    def _arm(self, worker_id: str, deadline: float | None, now: float) -> None:
        old = self.timers.pop(worker_id, None)
        if old is not None:
            old.cancel()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self.timers[worker_id] = loop.call_later(max(0.0, deadline - now), self._poll_later, worker_id)

    def _poll_later(self, worker_id: str) -> None:
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
