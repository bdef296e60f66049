"""Worker registry in Redis: who is up, in which role and tier, how loaded, how recently heard from.

One key per worker (`Keys.worker`) holds its info, load and stats with a TTL that each heartbeat renews:
a worker that dies or hangs drops out of routing when the TTL lapses, and its key is gone by itself. A
sorted set (`Keys.workers`) indexes the ids by last heartbeat, so a reader needs two round trips, not a
scan; ids whose key has lapsed are the dead workers the coordinator reaps (`lapsed`). Each heartbeat
writes the whole record again, so a worker re-registers by itself after Redis lost its contents.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import Role, WorkerInfo

JOB_STREAM_TTL_FACTOR = 30
"""A worker's job stream expires this many heartbeat TTLs after its last heartbeat (a dead worker's
queue does not outlive it, while a live one's is renewed on every beat)."""


@dataclass(frozen=True)
class WorkerStatus:
    info: WorkerInfo
    heartbeat_age_s: float
    load: int
    stats: dict[str, float] = field(default_factory=dict)
    """What the worker reports about its policies (e.g. realised offload share), for metrics."""
    draining: bool = False
    """The worker is finishing what it holds before it stops (a rolling restart): nothing new is routed to it."""


class WorkerRegistry:
    def __init__(self, redis: Redis, keys: Keys, heartbeat_ttl_s: float = 2.0):
        self.redis = redis
        self.keys = keys
        self.ttl_ms = max(1, int(heartbeat_ttl_s * 1000))

    @property
    def interval_s(self) -> float:
        """How often a worker beats: four beats per TTL, so one late beat does not make it look dead."""
        return self.ttl_ms / 4000

    async def register(self, info: WorkerInfo, load: int = 0, stats: dict[str, float] | None = None) -> None:
        await self.heartbeat(info, load, stats)

    async def heartbeat(self, info: WorkerInfo, load: int, stats: dict[str, float] | None = None,
                        draining: bool = False) -> None:
        now = time.time()
        record = json.dumps({"info": info.model_dump(mode="json"), "load": load, "stats": stats or {}, "beat": now,
                             "draining": draining})
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.worker(info.worker_id), record, px=self.ttl_ms)
        pipe.zadd(self.keys.workers, {info.worker_id: now})
        pipe.pexpire(self.keys.jobs(info.worker_id), self.ttl_ms * JOB_STREAM_TTL_FACTOR)
        await pipe.execute()

    async def deregister(self, worker_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.keys.workers, worker_id)
        pipe.delete(self.keys.worker(worker_id))
        await pipe.execute()

    async def expire(self, worker_id: str) -> None:
        """Take a worker out of routing now (its supervisor saw the process exit): the same as its TTL
        lapsing, a few seconds early. Its index entry stays for the coordinator to reap."""
        await self.redis.delete(self.keys.worker(worker_id))

    async def alive(self, roles: set[Role] | frozenset[Role] | None = None,
                    draining: bool = False) -> list[WorkerStatus]:
        """Registered workers whose heartbeat has not lapsed, optionally only some roles, sorted by id; the
        draining ones only with `draining=True` (routing never picks them; the failover still sees them in scan)."""
        return [s for s in (await self.scan())[0]
                if (roles is None or s.info.role in roles) and (draining or not s.draining)]

    async def scan(self) -> tuple[list[WorkerStatus], list[str]]:
        """(the live workers, the ids whose heartbeat lapsed but which are still indexed)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(self.keys.workers, 0, -1)
        pipe.smembers(self.keys.warming)
        index, warming = await pipe.execute()
        ids = [i.decode() if isinstance(i, bytes) else i for i in index]
        warming = {w.decode() if isinstance(w, bytes) else w for w in warming}
        if not ids:
            return [], []
        raw = await self.redis.mget([self.keys.worker(i) for i in ids])
        now = time.time()
        live, lapsed = [], []
        for wid, value in zip(ids, raw):
            if value is None:
                lapsed.append(wid)
                continue
            rec = json.loads(value)
            live.append(WorkerStatus(WorkerInfo.model_validate(rec["info"]), max(0.0, now - float(rec["beat"])),
                                     int(rec.get("load", 0)), dict(rec.get("stats", {})),
                                     bool(rec.get("draining")) or wid in warming))  # neither is routed to
        return sorted(live, key=lambda s: s.info.worker_id), lapsed

    async def reap(self, worker_id: str) -> bool:
        """Forget a worker whose heartbeat lapsed: its index entry and its job stream. False (and nothing
        done) if it came back meanwhile (a hung worker that resumed)."""
        if await self.redis.exists(self.keys.worker(worker_id)):
            return False
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.keys.workers, worker_id)
        pipe.delete(self.keys.jobs(worker_id))
        await pipe.execute()
        return True


def least_loaded(workers: list[WorkerStatus], counter: int = 0) -> WorkerStatus | None:
    """Lowest reported load; ties rotate by `counter` so equal workers share the traffic."""
    if not workers:
        return None
    low = min(w.load for w in workers)
    ties = [w for w in workers if w.load == low]
    return ties[counter % len(ties)]
