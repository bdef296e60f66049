"""The Executor for a cluster deployed on many hosts by deploy/'s Ansible playbooks (`tierserve deploy up`).

A new worker goes to the least-loaded host of its group (encode, or llm for prefill, decode and combined
workers; the host of the worker whose GPU it shares when it has one): its entry is added to that host's
`encode_node_workers` / `llm_node_workers` and the inventory written back at once, so that a later
`tierserve deploy up` reproduces the layout (coordinator/deploy/inventory_file.py). Then deploy/worker.yml
defines and starts that one service through the same roles site.yml runs, one code path per service manager.
Stopping a worker runs worker.yml with state absent: SIGTERM (a worker started with --drain-timeout-s drains),
its definition removed, and once that run exits 0 its entry leaves the inventory.

Every ansible-playbook run is a child process (never waited on: PlanSwitch polls `registered` and `stopped`),
with its output in a log file; one run at a time per host, the changes queued meanwhile going together in the
next. A run that fails or outlives `playbook_timeout_s` is surfaced: its workers are in `failures` with the
log's tail, a failed start never counts as registered (the caller fails the switch, which stops the new
workers), and a failed stop raises HostExecutorError from `stopped`.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import redis

from coordinator.deploy.hosts import DeployError
from coordinator.deploy.inventory_file import InventoryFile, WorkerDefaults
from coordinator.deploy.runner import Playbook
from coordinator.oserve.registry_executor import RegistryExecutor

log = logging.getLogger(__name__)
PLAYBOOK = "worker.yml"
LOG_TAIL_LINES = 20


class HostExecutorError(RuntimeError):
    """A worker's playbook failed in a way the switch cannot undo by itself (a stop); the message says which."""


@dataclass
class _Run:
    host: str
    state: str
    """worker.yml's tierserve_worker_state: started or absent."""
    workers: list[str]
    proc: subprocess.Popen
    log: Path
    began: float


class HostExecutor(RegistryExecutor):
    def __init__(self, inventory: InventoryFile, book: Playbook, client: redis.Redis, defaults: WorkerDefaults,
                 log_dir: Path, playbook_timeout_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(client, inventory.key_prefix)
        self.inventory, self.book, self.defaults = inventory, book, defaults
        self.log_dir, self.playbook_timeout_s, self.clock = log_dir, playbook_timeout_s, clock
        self.queued: dict[str, list[tuple[str, str]]] = {}
        """host -> [(state, worker id)] waiting for the host's run in progress to end."""
        self.running: dict[str, _Run] = {}
        self.outcome: dict[str, tuple[str, int | str]] = {}
        """worker id -> (state, exit status) of its last run ("timeout" when killed)."""
        self.failures: dict[str, str] = {}
        """worker id -> what went wrong, with the playbook log's tail."""
        self.hosts: dict[str, str] = {}
        """worker id -> the host it was placed on or retired from."""
        self._runs = 0

    def names(self) -> set[str]:
        return set(self.inventory.workers())

    @property
    def busy(self) -> bool:
        return bool(self.running) or any(self.queued.values())

    def start(self, worker_id: str, role: str, colocated_with: str | None) -> None:
        try:
            placed = self.inventory.place(worker_id, role, colocated_with, self.defaults)
        except DeployError as e:
            self._fail(worker_id, str(e))
            return
        self.inventory.save()
        self.hosts[worker_id] = placed.host
        self._queue(placed.host, "started", worker_id)

    def registered(self, worker_id: str) -> bool:
        self.pump()
        return self.outcome.get(worker_id) == ("started", 0) and super().registered(worker_id)

    def stop(self, worker_id: str) -> None:
        placed = self.inventory.workers().get(worker_id)
        if placed is None:  # never placed (its start failed before any playbook): nothing runs
            self.outcome[worker_id] = ("absent", 0)
            return
        host = self.hosts[worker_id] = placed.host
        queue = self.queued.get(host, [])
        if ("started", worker_id) in queue:  # its playbook never ran: drop the entry, nothing to stop
            queue.remove(("started", worker_id))
            self.inventory.remove(worker_id)
            self.inventory.save()
            self.outcome[worker_id] = ("absent", 0)
            return
        run = self.running.get(host)
        if run is not None and run.state == "started" and worker_id in run.workers:
            self._kill(run)  # a start still running when the switch gives up: stop it, then remove the worker
        self._queue(host, "absent", worker_id)

    def stopped(self, worker_id: str) -> bool:
        self.pump()
        state, rc = self.outcome.get(worker_id, ("", 0))
        if state != "absent":
            return False
        if rc != 0:
            raise HostExecutorError(self.failures[worker_id])
        return True

    def pump(self) -> None:
        """Reap the runs that ended, then start each idle host's queued changes (one run per host)."""
        changed = False
        for host, run in list(self.running.items()):
            rc: int | str | None = run.proc.poll()
            if rc is None and self.clock() - run.began > self.playbook_timeout_s:
                self._kill(run)
                rc = "timeout"
            if rc is None:
                continue
            del self.running[host]
            for w in run.workers:
                self.outcome[w] = (run.state, rc)
                if rc != 0:
                    what = f"ran past {self.playbook_timeout_s:.0f} s" if rc == "timeout" else f"exited {rc}"
                    self._fail(w, f"{'starting' if run.state == 'started' else 'stopping'} {w} on {host}: "
                                  f"ansible-playbook {what}; log {run.log}:\n{_tail(run.log)}")
                elif run.state == "absent":
                    changed |= self.inventory.remove(w) is not None
        if changed:
            self.inventory.save()
        for host, queue in self.queued.items():
            if queue and host not in self.running:
                state = queue[0][0]
                batch = [w for _, w in itertools.takewhile(lambda q, s=state: q[0] == s, queue)]
                del queue[:len(batch)]
                self.running[host] = self._launch(host, state, batch)

    def abort(self) -> None:
        """Stop every run in progress and forget the queued ones (an interrupted switch)."""
        for run in self.running.values():
            self._kill(run)
        self.running.clear()
        self.queued.clear()

    def _queue(self, host: str, state: str, worker_id: str) -> None:
        self.queued.setdefault(host, []).append((state, worker_id))
        self.pump()

    def _launch(self, host: str, state: str, workers: list[str]) -> _Run:
        self._runs += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{self._runs:03d}-{state}-{host}.log"
        book = replace(self.book, extra_vars=self.book.extra_vars | {
            "tierserve_worker_host": host, "tierserve_worker_ids": workers, "tierserve_worker_state": state})
        env = dict(os.environ, ANSIBLE_CONFIG=str(book.playbooks / "ansible.cfg"))
        with path.open("w") as out:
            proc = subprocess.Popen(book.argv(PLAYBOOK), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=book.playbooks, start_new_session=True)
        log.info("worker playbook", extra={"host": host, "state": state, "workers": workers, "log": str(path)})
        return _Run(host, state, workers, proc, path, self.clock())

    def _kill(self, run: _Run) -> None:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGTERM)
            try:
                run.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()

    def _fail(self, worker_id: str, message: str) -> None:
        self.failures[worker_id] = message
        log.error("worker playbook failed", extra={"worker": worker_id, "error": message})


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read the log: {e.strerror})"
