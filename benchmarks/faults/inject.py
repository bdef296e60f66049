"""Real faults on a local cluster (coordinator/launcher.py LocalCluster): kill -9, SIGSTOP/SIGCONT, a Redis
restart on the same port, FLUSHALL; and a supervision thread that restarts what dies, as `tierserve up` does."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import redis

from coordinator.launcher import LocalCluster


class Supervising:
    """Runs `cluster.supervise()` every 0.2 s in a thread until closed; keeps what it reported."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster, self.reports = cluster, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.cluster.supervise(self.reports.append)
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def holding(url: str, worker_id: str) -> int:
    """Requests the coordinator has in flight whose current holder is this worker."""
    try:
        for w in httpx.get(f"{url}/v1/cluster", timeout=2).json()["workers"]:
            if w["worker_id"] == worker_id:
                return int(w.get("holding", 0))
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return 0


def wait_until_holding(cluster: LocalCluster, worker_id: str, timeout_s: float = 5.0) -> bool:
    """Wait (bounded) until the worker holds a request, so a fault hits work in flight."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if holding(cluster.url, worker_id) > 0:
            return True
        time.sleep(0.02)
    return False


def kill9(cluster: LocalCluster, name: str) -> None:
    os.kill(cluster.procs[name].pid, signal.SIGKILL)


def stop_for(cluster: LocalCluster, name: str, seconds: float) -> threading.Thread:
    """SIGSTOP the process now and SIGCONT it after `seconds` (in a thread); returns the thread."""
    pid = cluster.procs[name].pid
    os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        time.sleep(seconds)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    t = threading.Thread(target=resume, daemon=True)
    t.start()
    return t


def restart_redis(cluster: LocalCluster, down_s: float = 1.0) -> None:
    if cluster.redis is None:
        raise RuntimeError("the cluster uses an outside Redis; a restart needs its private one (redis_url=None)")
    cluster.redis.restart(down_s)


def flushall(cluster: LocalCluster) -> None:
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        client.flushall()
    finally:
        client.close()
