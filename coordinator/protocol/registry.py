"""Worker registry in Redis: who is up, in which role and tier, how loaded, how recently heard from."""

from __future__ import annotations

import time
import json
from dataclasses import dataclass, field

from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import Role, WorkerInfo


@dataclass(frozen=True)
class WorkerStatus:
    info: WorkerInfo
    heartbeat_age_s: float
    load: int
    stats: dict[str, float] = field(default_factory=dict)
    """What the worker reports about its policies (e.g. realised offload share), for metrics."""


class WorkerRegistry:
    """Registration is a hash entry; liveness is a heartbeat key whose TTL lapses if the worker dies."""

    def __init__(self, redis: Redis, keys: Keys, heartbeat_ttl_s: float = 10.0):
        self.redis = redis
        self.keys = keys
        self.ttl_ms = int(heartbeat_ttl_s * 1000)

    async def register(self, info: WorkerInfo, load: int = 0, stats: dict[str, float] | None = None) -> None:
        await self.redis.hset(self.keys.workers, info.worker_id, info.model_dump_json())
        await self.heartbeat(info.worker_id, load, stats)

    async def heartbeat(self, worker_id: str, load: int, stats: dict[str, float] | None = None) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.heartbeat(worker_id), repr(time.time()), px=self.ttl_ms)
        pipe.set(self.keys.load(worker_id), json.dumps({"load": load, "stats": stats or {}}), px=self.ttl_ms)
        await pipe.execute()

    async def deregister(self, worker_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self.keys.workers, worker_id)
        pipe.delete(self.keys.heartbeat(worker_id), self.keys.load(worker_id))
        await pipe.execute()

    async def alive(self, roles: set[Role] | frozenset[Role] | None = None) -> list[WorkerStatus]:
        """Registered workers whose heartbeat has not lapsed, optionally only some roles."""
        raw = await self.redis.hgetall(self.keys.workers)
        infos = [WorkerInfo.model_validate_json(v) for v in raw.values()]
        if roles is not None:
            infos = [i for i in infos if i.role in roles]
        if not infos:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for i in infos:
            pipe.get(self.keys.heartbeat(i.worker_id))
            pipe.get(self.keys.load(i.worker_id))
        vals = await pipe.execute()
        now = time.time()
        out = []
        for n, info in enumerate(infos):
            hb, load = vals[2 * n], vals[2 * n + 1]
            if hb is None:
                continue
            status = json.loads(load) if load else {}
            out.append(WorkerStatus(info, max(0.0, now - float(hb)), int(status.get("load", 0)),
                                    dict(status.get("stats", {}))))
        return sorted(out, key=lambda s: s.info.worker_id)


def least_loaded(workers: list[WorkerStatus], counter: int = 0) -> WorkerStatus | None:
    """Lowest reported load; ties rotate by `counter` so equal workers share the traffic."""
    if not workers:
        return None
    low = min(w.load for w in workers)
    ties = [w for w in workers if w.load == low]
    return ties[counter % len(ties)]
