"""A worker killed while the cluster is still starting is restarted like any later death, and the start
completes; a worker that exits on its own while starting (a bad flag) still fails the start with its log."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest

from coordinator.launcher import ClusterError, ClusterSpec, LocalCluster
from coordinator.protocol.colocation import channel_path
from coordinator.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _spec(redis_url: str, **kw) -> ClusterSpec:
    return ClusterSpec(key_prefix=f"tstest-{uuid.uuid4().hex[:10]}", port=free_port(), redis_url=redis_url,
                       encode_workers=1, llm_roles=["combined"], **kw)


def test_a_worker_killed_while_starting_is_restarted_and_the_start_completes(redis_url, tmp_path):
    cluster = LocalCluster(_spec(redis_url), tmp_path / "logs")
    said: list[str] = []
    outcome: list[BaseException | None] = []

    def start():
        try:
            cluster.start(timeout_s=180, report=said.append)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            outcome.append(e)

    t = threading.Thread(target=start)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while "llm-0-combined" not in cluster.procs and time.monotonic() < deadline:
            time.sleep(0.01)
        first = cluster.procs["llm-0-combined"]
        first.send_signal(signal.SIGKILL)  # before the cluster is ready: start() is still waiting on it
        t.join(200)
        assert outcome == [None], outcome
        assert any("llm-0-combined exited (killed by SIGKILL); restarting it" in m for m in said), said
        assert cluster.procs["llm-0-combined"].pid != first.pid and cluster.procs["llm-0-combined"].poll() is None
    finally:
        t.join(200)
        cluster.stop()
    assert not channel_path(cluster.spec.key_prefix, "encode-0").exists()  # stop() leaves no co-location file


def test_a_worker_that_exits_on_its_own_while_starting_fails_the_start(redis_url, tmp_path):
    cluster = LocalCluster(_spec(redis_url, llm_args=["--no-such-flag"]), tmp_path / "logs")
    with pytest.raises(ClusterError, match=r"llm-0-combined exited while starting \(exit code 2\)"):
        cluster.start(timeout_s=120, report=lambda m: None)
    assert not cluster.procs  # start() stopped what it had started
