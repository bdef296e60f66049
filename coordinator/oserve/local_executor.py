"""The Executor for a local cluster: worker processes under `tierserve up`'s supervisor (LocalCluster).

Not thread-safe on its own: call it from the thread that runs `LocalCluster.supervise` (PlanControl.tick is).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import redis

from coordinator.launcher import LocalCluster
from coordinator.oserve.registry_executor import RegistryExecutor


class LocalExecutor(RegistryExecutor):
    def __init__(self, cluster: LocalCluster, client: redis.Redis, drain_timeout_s: float = 30.0,
                 llm_extra: list[str] | None = None, clock: Callable[[], float] = time.monotonic,
                 encode_extra: list[str] | None = None) -> None:
        super().__init__(client, cluster.spec.key_prefix)
        self.cluster = cluster
        self.drain_timeout_s = drain_timeout_s
        """A retired worker still running this long after its SIGTERM is killed (its requests re-run)."""
        self.llm_extra = llm_extra or []
        """Extra flags for new LLM workers (e.g. --drain-timeout-s, where llm_node has it)."""
        self.encode_extra = encode_extra or []
        """Extra flags for new encode workers (--drain-timeout-s: a retired encoder finishes its micro-batches)."""
        self.clock = clock
        self.retiring: dict[str, tuple[subprocess.Popen | None, float]] = {}

    def names(self) -> set[str]:
        return set(self.cluster.procs) | set(self.retiring)

    def start(self, worker_id: str, role: str, colocated_with: str | None) -> None:
        module = "encode_node" if role == "encode" else "llm_node"
        self.cluster.add_worker(worker_id, module, role, colocated_with,
                                self.llm_extra if module == "llm_node" else self.encode_extra)

    def stop(self, worker_id: str) -> None:
        self.retiring[worker_id] = (self.cluster.retire(worker_id), self.clock())

    def stopped(self, worker_id: str) -> bool:
        proc, since = self.retiring.get(worker_id, (None, 0.0))
        if proc is None or proc.poll() is not None:
            return True
        if self.clock() - since > self.drain_timeout_s:
            proc.kill()
            proc.wait(5)
            return True
        return False


def attach(cluster: LocalCluster, plan=None, admin_token: str | None = None, drain_timeout_s: float = 30.0):
    """A PlanControl for `tierserve up`: PUT /v1/admin/plan switches this cluster's processes (call its `tick`
    from the supervisor loop). New workers (LLM and encode) drain for up to `drain_timeout_s` when retired."""
    import httpx

    from coordinator.oserve.control import PlanControl
    from coordinator.oserve.layout import local_units

    s = cluster.spec
    client = redis.Redis.from_url(cluster.redis_url, socket_timeout=5.0)
    drain = ["--drain-timeout-s", str(drain_timeout_s)]
    executor = LocalExecutor(cluster, client, drain_timeout_s + 10.0, drain, encode_extra=drain)
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}

    def apply_policy(policy: dict) -> None:
        r = httpx.put(f"{cluster.url}/v1/admin/policy", json=policy, headers=headers, timeout=10)
        r.raise_for_status()

    units = local_units(s.encode_workers, [s.colocated_with(i) for i in range(s.encode_workers)], s.llm_roles)
    return PlanControl(client, s.key_prefix, executor, units, executor.names, apply_policy, plan)
