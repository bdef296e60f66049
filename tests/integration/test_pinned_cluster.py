"""Under `pin_cores` every process of a local cluster runs where ClusterSpec says: each worker on its device's
core, the coordinator and the private Redis on the encode workers' cores, never on an LLM worker's core
(read back from the kernel with sched_getaffinity, for every thread of each process)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import PrivateRedis, free_port

pytestmark = [pytest.mark.redis]
CORES = sorted(os.sched_getaffinity(0))


def _threads_affinity(pid: int) -> set[frozenset[int]]:
    """The distinct CPU sets of every thread of process `pid`."""
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


def test_host_cores_are_the_encode_cores_and_never_every_core():
    one = ClusterSpec(encode_workers=1, pin_cores=True)
    assert one.core_of(0) == CORES[0] and one.core_of(len(CORES)) == CORES[0]  # slots wrap around the cores
    assert one.host_cores() == ({CORES[0]} if len(CORES) > 1 else None)
    assert ClusterSpec(encode_workers=1, pin_cores=False).host_cores() is None
    assert ClusterSpec(encode_workers=0, pin_cores=True).host_cores() is None
    # encode workers on every core: nothing is left to keep them off, so they float
    assert ClusterSpec(encode_workers=len(CORES), pin_cores=True).host_cores() is None


def test_a_private_redis_runs_on_the_cores_it_is_given():
    server = PrivateRedis(cpus={CORES[-1]}).start()
    try:
        assert _threads_affinity(server.proc.pid) == {frozenset({CORES[-1]})}
    finally:
        server.stop()


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores: with one, every process runs on it")
def test_the_coordinator_and_redis_stay_off_the_llm_workers_core(tmp_path):
    spec = ClusterSpec(key_prefix=f"tspin-{uuid.uuid4().hex[:10]}", port=free_port(), encode_workers=1,
                       llm_roles=["combined"], pin_cores=True, llm_args=["--engine", "null"])
    with LocalCluster(spec, tmp_path / "logs") as cluster:
        encode, llm = frozenset({CORES[0]}), frozenset({CORES[1]})
        assert _threads_affinity(cluster.procs["encode-0"].pid) == {encode}
        assert _threads_affinity(cluster.procs["llm-0-combined"].pid) == {llm}
        assert _threads_affinity(cluster.procs["coordinator"].pid) == {encode}
        assert cluster.redis is not None and _threads_affinity(cluster.redis.proc.pid) == {encode}
