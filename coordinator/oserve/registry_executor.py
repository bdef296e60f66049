"""What every Executor does the same way wherever its workers run: it holds new workers out of routing (the
warming set) and sees them in the registry, both in Redis under the cluster's prefix."""

from __future__ import annotations

import redis

from coordinator.protocol.keys import Keys


class RegistryExecutor:
    """hold, release and registered of the Executor protocol (coordinator/oserve/switch.py)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.keys = Keys(prefix)

    def hold(self, worker_ids: list[str]) -> None:
        if worker_ids:
            self.redis.sadd(self.keys.warming, *worker_ids)

    def release(self, worker_ids: list[str]) -> None:
        if worker_ids:
            self.redis.srem(self.keys.warming, *worker_ids)

    def registered(self, worker_id: str) -> bool:
        return bool(self.redis.exists(self.keys.worker(worker_id)))
