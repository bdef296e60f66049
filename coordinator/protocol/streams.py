"""Job streams (one Redis stream per worker, read through a consumer group) and token streams."""

from __future__ import annotations

import logging

from pydantic import TypeAdapter
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import JOB_ADAPTER, Holder, Job, TokenEvent

log = logging.getLogger(__name__)
GROUP = "workers"
FIELD = "m"
_FIELD_B = FIELD.encode()
TOKEN_STREAM_TTL_S = 600
JOB_STREAM_MAXLEN = 100_000
"""A safety cap only: admission control bounds what is queued far below it (a trimmed job would be
re-run by the coordinator once it noticed, but it should never come to that)."""
REPLY_STREAM_MAXLEN = 1_000_000
"""A safety cap only: the coordinator trims what it has read."""
_EVENTS = TypeAdapter(list[TokenEvent])
"""A reply-stream entry: the events one write sent to that stream (one engine step's, for all the requests on
that stream), in order. One entry per stream per step, not per token: a step of 30 sequences is one XADD."""


def job_fields(job: Job) -> dict:
    return {FIELD: job.model_dump_json()}


async def push_job(redis: Redis, keys: Keys, worker_id: str, job: Job) -> None:
    await redis.xadd(keys.jobs(worker_id), job_fields(job), maxlen=JOB_STREAM_MAXLEN, approximate=True)


async def append_jobs(redis: Redis, entries: list[tuple[str, bytes]]) -> None:
    """(job stream key, a job's or micro-batch's JSON) entries, in order, in one round trip (what a job link
    could not take, links.py)."""
    pipe = redis.pipeline(transaction=False)
    for key, body in entries:
        pipe.xadd(key, {FIELD: body}, maxlen=JOB_STREAM_MAXLEN, approximate=True)
    await pipe.execute()


def reply_key(keys: Keys, job) -> str:
    """Where `job`'s token events go: its reply stream when it names one of this cluster's, else the
    request's own stream (a reply_to outside the cluster's `replies:` keys is never written to)."""
    if job.reply_to and job.reply_to.startswith(f"{keys.prefix}:replies:"):
        return job.reply_to
    return keys.tokens(job.request_id)


def reply_address(keys: Keys, job) -> str | None:
    """The direct reply link that stands in for `job`'s reply stream, if its coordinator has one."""
    return job.reply_addr if job.reply_to and reply_key(keys, job) == job.reply_to else None


def event_for(job, **fields) -> TokenEvent:
    """A TokenEvent of `job`'s request and attempt."""
    return TokenEvent(request_id=job.request_id, attempt=job.attempt, **fields)


async def hand_over(redis: Redis, keys: Keys, holder: Holder, job: Job, reply: str) -> None:
    """Append `job` to the next worker's stream and tell the coordinator who holds the request now, in
    one round trip (if that worker dies, the coordinator re-runs the request)."""
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(keys.jobs(holder.worker_id), job_fields(job), maxlen=JOB_STREAM_MAXLEN, approximate=True)
    _add_event(pipe, reply, event_for(job, holder=holder))
    await pipe.execute()


class JobStream:
    """A worker's inbox. Entries are acked once handed to the compute. A worker process starts on a fresh
    stream: what an earlier process of the same id left behind belongs to requests the coordinator
    re-runs elsewhere (it sees the holder's instance change), so running them here would only duplicate."""

    def __init__(self, redis: Redis, keys: Keys, worker_id: str):
        self.redis = redis
        self.key = keys.jobs(worker_id)
        self.consumer = worker_id

    async def open(self, fresh: bool = True) -> int:
        """Create the stream and its group; with `fresh`, first drop what is left from an earlier process.
        Returns how many entries were dropped."""
        dropped = 0
        if fresh:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xlen(self.key)
            pipe.delete(self.key)
            dropped = (await pipe.execute())[0]
        await self._create_group()
        return dropped

    async def _create_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def read(self, count: int, block_ms: int | None, start: str = ">") -> list[tuple[str, Job | None]]:
        """Up to `count` new jobs (block_ms None: don't wait); an entry that does not parse comes back as
        None (ack and log it). The group is re-created if Redis lost it (restart, FLUSHALL, expiry)."""
        try:
            resp = await self.redis.xreadgroup(GROUP, self.consumer, {self.key: start}, count=count, block=block_ms)
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            log.warning("job stream or its group is gone (Redis restarted or flushed); re-creating it",
                        extra={"stream": self.key})
            await self._create_group()
            return []
        out: list[tuple[str, Job | None]] = []
        for _key, entries in resp or []:
            for entry_id, fields in entries:
                try:
                    out.append((entry_id, JOB_ADAPTER.validate_json(fields[_FIELD_B])))
                except Exception as e:  # malformed control message: never crash the worker on it
                    log.error("dropping malformed job", extra={"entry": entry_id, "error": str(e)})
                    out.append((entry_id, None))
        return out

    async def waiting(self) -> int:
        """Entries not taken yet (the stream's length less those delivered and not acked)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(self.key)
        pipe.xpending(self.key, GROUP)
        try:
            length, pending = await pipe.execute()
        except ResponseError:  # no group (Redis lost it): the next read re-creates it
            return 0
        return max(0, length - int(pending.get("pending", 0) if isinstance(pending, dict) else 0))

    async def delete(self) -> None:
        await self.redis.delete(self.key)

    async def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            await self._acking(entry_ids).execute()

    async def ack_and_count(self, entry_id: str) -> int:
        """`ack`, and the entries left on the stream after it, in the same round trip."""
        pipe = self._acking((entry_id,))
        pipe.xlen(self.key)
        return (await pipe.execute())[-1]

    def _acking(self, entry_ids: tuple[str, ...]):
        """A pipeline that acks the entries and deletes them (so the stream's length is what is still queued)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(self.key, GROUP, *entry_ids)
        pipe.xdel(self.key, *entry_ids)
        return pipe


def parse_token_events(fields: dict) -> list[TokenEvent]:
    """The events of one reply-stream entry, in the order they were published."""
    return parse_event_list(fields[_FIELD_B])


def parse_event_list(body: bytes) -> list[TokenEvent]:
    """A reply-stream entry's value (or a reply link's frame, link_wire.py): its events in order."""
    return _EVENTS.validate_json(body)


def event_list(evs: list[TokenEvent]) -> bytes:
    """The JSON of events one write sends to one stream: an entry's value, or a reply link frame's body."""
    return _EVENTS.dump_json(evs, exclude_defaults=True)


def by_stream(events: list[tuple[str, TokenEvent]]) -> dict[str, list[TokenEvent]]:
    """(stream key, event) pairs grouped by stream, each group in order."""
    out: dict[str, list[TokenEvent]] = {}
    for key, ev in events:
        out.setdefault(key, []).append(ev)
    return out


def _add_event(pipe, key: str, ev: TokenEvent) -> None:
    add_entries(pipe, [(key, event_list([ev]))])


def add_entries(pipe, entries: list[tuple[str, bytes]]) -> None:
    """Queue on `pipe` one reply-stream entry per (stream key, event_list body), in order."""
    for key, body in entries:
        pipe.xadd(key, {FIELD: body}, maxlen=REPLY_STREAM_MAXLEN, approximate=True)
        # Every write renews the TTL (a step's events mostly go to one coordinator's stream): a stream whose
        # reader left (and deleted it) cannot live forever.
        pipe.expire(key, TOKEN_STREAM_TTL_S)


async def publish_entries(redis: Redis, entries: list[tuple[str, bytes]]) -> None:
    """`add_entries` in one round trip."""
    if not entries:
        return
    pipe = redis.pipeline(transaction=False)
    add_entries(pipe, entries)
    await pipe.execute()


async def publish_tokens(redis: Redis, events: list[tuple[str, TokenEvent]]) -> None:
    """(stream key, event) pairs, e.g. all of one engine step's events, in one round trip."""
    await publish_entries(redis, [(key, event_list(evs)) for key, evs in by_stream(events).items()])
