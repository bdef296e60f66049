"""Job streams (one Redis stream per worker, read through a consumer group) and token streams."""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import JOB_ADAPTER, Job, TokenEvent

log = logging.getLogger(__name__)
GROUP = "workers"
FIELD = "m"
_FIELD_B = FIELD.encode()
TOKEN_STREAM_TTL_S = 600


async def push_job(redis: Redis, keys: Keys, worker_id: str, job: Job) -> None:
    await redis.xadd(keys.jobs(worker_id), {FIELD: job.model_dump_json()})


class JobStream:
    """A worker's inbox. Entries are acked once handed to the compute; what a crash leaves un-acked
    comes back from `stranded()` when the worker restarts, and is failed rather than left hanging."""

    def __init__(self, redis: Redis, keys: Keys, worker_id: str):
        self.redis = redis
        self.key = keys.jobs(worker_id)
        self.consumer = worker_id

    async def open(self) -> None:
        try:
            await self.redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def read(self, count: int, block_ms: int | None, start: str = ">") -> list[tuple[str, Job | None]]:
        """Up to `count` new jobs (block_ms None: don't wait); an entry that does not parse comes back as
        None (ack and log it). start="0" re-reads this consumer's delivered but un-acked entries."""
        resp = await self.redis.xreadgroup(GROUP, self.consumer, {self.key: start}, count=count, block=block_ms)
        out: list[tuple[str, Job | None]] = []
        for _key, entries in resp or []:
            for entry_id, fields in entries:
                try:
                    out.append((entry_id, JOB_ADAPTER.validate_json(fields[_FIELD_B])))
                except Exception as e:  # malformed control message: never crash the worker on it
                    log.error("dropping malformed job", extra={"entry": entry_id, "error": str(e)})
                    out.append((entry_id, None))
        return out

    async def stranded(self) -> list[tuple[str, Job | None]]:
        """Jobs a previous run of this worker took but never handed off (it crashed)."""
        return await self.read(10_000, None, start="0")

    async def unread(self) -> list[tuple[str, Job | None]]:
        """Jobs queued but not taken yet (the worker is stopping)."""
        return await self.read(10_000, None)

    async def delete(self) -> None:
        await self.redis.delete(self.key)

    async def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xack(self.key, GROUP, *entry_ids)
            pipe.xdel(self.key, *entry_ids)
            await pipe.execute()


def parse_token_event(fields: dict) -> TokenEvent:
    return TokenEvent.model_validate_json(fields[_FIELD_B])


async def publish_tokens(redis: Redis, keys: Keys, events: list[tuple[str, TokenEvent]]) -> None:
    """All of one engine step's events in one round trip."""
    if not events:
        return
    pipe = redis.pipeline(transaction=False)
    for request_id, ev in events:
        key = keys.tokens(request_id)
        pipe.xadd(key, {FIELD: ev.model_dump_json(exclude_defaults=True)})
        # Every write renews the TTL: a stream whose reader left (and deleted it) cannot live forever.
        pipe.expire(key, TOKEN_STREAM_TTL_S)
    await pipe.execute()
