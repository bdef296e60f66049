"""An encode worker's micro-batches, in arrival order, from its two ways in: its job stream in Redis (read through
the consumer group, one entry ahead of the encoder at most), and its job link, over which the coordinator writes
the batches its dispatch policy released when it has one up (coordinator/protocol/link_wire.py: one process hop
less on every request's way to the encoder). A job that came both ways (a link batch the coordinator appended to
the stream as well, because the link broke before its ack arrived) is taken once, by request and attempt."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque

from redis.asyncio import Redis

from coordinator.protocol.link_listener import LinkListener
from coordinator.protocol.messages import JOB_ADAPTER, EncodeBatch, EncodeJob
from coordinator.protocol.streams import JobStream

log = logging.getLogger(__name__)
SEEN = 8192
"""(request, attempt) pairs remembered to drop a second copy: far more than a link holds unacked."""


class JobInbox:
    def __init__(self, redis: Redis, jobs: JobStream, secret: bytes | None):
        self.redis = redis
        self.jobs = jobs
        self.secret = secret
        self.queue: deque[tuple[str | None, list[EncodeJob]]] = deque()
        """(stream entry id, or None for a link batch; its jobs), oldest first."""
        self.ready = asyncio.Event()
        self.taken = asyncio.Event()
        """Set while the stream has nothing in the queue: the stream reader may read one more entry."""
        self.taken.set()
        self.link_queued = 0
        """Link batches in the queue (the stream's are counted by its length: acked entries are deleted)."""
        self.seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.listener: LinkListener | None = None

    async def listen(self, host: str) -> str:
        """Open the job link on `host` (any free port); its address goes into the worker's registry record."""
        self.listener = LinkListener(self.jobs.key, self.secret, self._take)
        return await self.listener.start(host)

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()

    def _take(self, body: bytes) -> None:
        entry = JOB_ADAPTER.validate_json(body)
        if not isinstance(entry, (EncodeBatch, EncodeJob)):
            raise ValueError(f"an encode worker takes micro-batches, not {type(entry).__name__}")
        self.queue.append((None, _jobs_of(entry)))
        self.link_queued += 1
        self.ready.set()

    async def read_stream_once(self) -> None:
        """One blocking read of the stream, once the encoder took what it read before (a supervised loop)."""
        await self.taken.wait()
        for entry_id, entry in await self.jobs.read(1, block_ms=500):
            if entry is None:  # malformed: JobStream logged it
                await self.jobs.ack(entry_id)
                continue
            self.queue.append((entry_id, _jobs_of(entry)))
            self.taken.clear()
            self.ready.set()

    async def next(self, timeout_s: float) -> tuple[str | None, list[EncodeJob]] | None:
        """The oldest batch, less the jobs taken before; None after `timeout_s` with nothing."""
        if not self.queue:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.ready.wait()
            except TimeoutError:
                return None
        entry_id, jobs = self.queue.popleft()
        if entry_id is None:
            self.link_queued -= 1
        if not self.queue:
            self.ready.clear()
        if not any(e is not None for e, _ in self.queue):
            self.taken.set()
        return entry_id, self._fresh(jobs)

    def _fresh(self, jobs: list[EncodeJob]) -> list[EncodeJob]:
        out = []
        for job in jobs:
            key = (job.request_id, job.attempt)
            if key in self.seen:
                log.info("dropping a job that came both ways", extra={"request_id": job.request_id})
                continue
            self.seen[key] = None
            if len(self.seen) > SEEN:
                self.seen.popitem(last=False)
            out.append(job)
        return out

    async def done(self, entry_id: str | None) -> int:
        """A batch is done: ack its stream entry (if it came that way); the batches still queued for this worker."""
        if entry_id is not None:
            return await self.jobs.ack_and_count(entry_id) + self.link_queued
        return await self.waiting()

    async def waiting(self) -> int:
        """Batches queued: the stream's (its length) and the link's."""
        return await self.redis.xlen(self.jobs.key) + self.link_queued


def _jobs_of(entry) -> list[EncodeJob]:
    if isinstance(entry, EncodeBatch):
        return list(entry.jobs)
    return [entry] if isinstance(entry, EncodeJob) else []
