"""Apply a layout diff without losing a request: start, wait until the new workers serve, then retire the old.

`PlanSwitch` is a state machine stepped by its caller (the supervisor loop of `tierserve up`, every fraction of
a second, so supervision goes on meanwhile), with an injected clock:

1. starting: the new units' processes start, held out of routing (`Keys.warming`); a worker registers only once
   its model is loaded and its receiver listens. When every new worker is registered they are released
   together, so routing never sees half a layout (a prefill worker whose decode worker is not up yet), and
   the new layout serves (`serving_at`).
2. retiring: the old units' workers are asked to stop, decode workers last, once every other retiring worker
   has exited (SIGTERM: an LLM worker started with a drain timeout takes no new work and finishes what it
   holds, and a draining prefill worker still hands its KV caches to a decode worker; whatever a worker still holds when it exits is re-run by
   the coordinator's failover, continuing after the tokens already streamed, so nothing is lost either way).
3. done (`done_at`), or failed: new workers that do not register within `start_timeout_s` are stopped and
   the old layout stays.

`Executor` is what it drives; both share the warming set and the registry check (registry_executor.py):

- `LocalExecutor` (local_executor.py): processes under `tierserve up`'s supervisor; PUT /v1/admin/plan asks,
  the supervisor loop's PlanControl applies.
- `HostExecutor` (host_executor.py): hosts deployed by deploy/'s Ansible playbooks, driven by `tierserve deploy
  switch NEW_PLAN.yaml -i INVENTORY` (coordinator/deploy/switch.py) through the same PlanControl. A new worker
  goes to the least-loaded host of its group (or the host of the worker whose GPU it shares), its entry is
  added to the inventory (written back atomically, so `tierserve deploy up` reproduces the layout) and
  deploy/worker.yml starts that one service without waiting on it; `registered` is its playbook exited 0 and
  the worker in the registry. `stop` runs worker.yml with state absent (SIGTERM, the worker drains; its
  definition removed), and `stopped` is that run exited 0, after which its entry leaves the inventory. A failed
  start never registers (the command then fails the switch at once, which stops the new workers); a failed stop
  raises HostExecutorError, with the playbook log's tail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import BaseModel

from coordinator.oserve.layout import LayoutDiff, Namer, Unit
from coordinator.protocol.roles import NodeRole

Phase = Literal["requested", "starting", "retiring", "done", "failed"]


class Executor(Protocol):
    """Where a plan's workers run."""

    def hold(self, worker_ids: list[str]) -> None:
        """Keep these workers out of routing once they register (warming)."""

    def release(self, worker_ids: list[str]) -> None:
        """Let routing see these workers (all at once: a layout is routable only whole)."""

    def start(self, worker_id: str, role: str, colocated_with: str | None) -> None:
        """Start one worker process (it registers itself once ready)."""

    def registered(self, worker_id: str) -> bool:
        """Whether the worker is in the registry now (model loaded, serving)."""

    def stop(self, worker_id: str) -> None:
        """Ask the worker to stop (drain, then exit) and stop supervising it."""

    def stopped(self, worker_id: str) -> bool:
        """Whether its process has exited (killed after the executor's own drain timeout)."""


class SwitchStatus(BaseModel):
    """What GET /v1/admin/plan shows of a switch (times are wall clock, seconds)."""

    id: str
    phase: Phase
    change: str = ""
    """The diff in words."""
    requested_at: float
    serving_at: float | None = None
    """When every new worker was registered: the new layout serves."""
    done_at: float | None = None
    switch_s: float | None = None
    """From the request (the PUT) to the new layout serving."""
    error: str | None = None
    starting: list[str] = []
    retiring: list[str] = []


class PlanSwitch:
    def __init__(self, id: str, diff: LayoutDiff, executor: Executor, namer: Namer, requested_at: float,
                 clock: Callable[[], float], start_timeout_s: float = 180.0) -> None:
        self.diff, self.executor, self.clock = diff, executor, clock
        self.start_timeout_s = start_timeout_s
        self.new_units: list[Unit] = []
        self._procs: list[tuple[str, str, str | None]] = []
        for role in diff.start:
            procs = namer.unit(role)
            self.new_units.append(Unit(role=role, workers=tuple(n for n, _, _ in procs)))
            self._procs += procs
        self.status = SwitchStatus(id=id, phase="requested", change=diff.describe(), requested_at=requested_at,
                                   starting=[n for n, _, _ in self._procs],
                                   retiring=[w for u in diff.retire for w in u.workers])
        self._started_at = 0.0
        self._decoders = [w for u in diff.retire if u.role == "D" for w in u.workers]
        self._upstream = [w for w in self.status.retiring if w not in self._decoders]
        self._decoders_asked = False

    @property
    def finished(self) -> bool:
        return self.status.phase in ("done", "failed")

    def layout(self) -> list[Unit]:
        """The units in force once this switch is done (the old ones if it failed)."""
        if self.status.phase == "failed":
            return [*self.diff.keep, *self.diff.retire]
        return [*self.diff.keep, *self.new_units]

    def roles(self) -> list[NodeRole]:
        return [u.role for u in self.layout()]

    def step(self) -> bool:
        """Advance as far as possible now; True if the status changed."""
        s, now = self.status, self.clock()
        before = s.phase
        if s.phase == "requested":
            self.executor.hold(s.starting)
            for name, role, colocated in self._procs:
                self.executor.start(name, role, colocated)
            self._started_at, s.phase = now, "starting"
        if s.phase == "starting":
            if all(self.executor.registered(n) for n in s.starting):
                self.executor.release(s.starting)
                s.serving_at = now
                s.switch_s = now - s.requested_at
                for w in self._upstream:
                    self.executor.stop(w)
                s.phase = "retiring"
            elif now - self._started_at > self.start_timeout_s:
                missing = [n for n in s.starting if not self.executor.registered(n)]
                for n in s.starting:
                    self.executor.stop(n)
                self.executor.release(s.starting)
                s.phase, s.error = "failed", (f"new workers {missing} did not register within "
                                              f"{self.start_timeout_s:.0f} s; stopped them, the old layout stays")
                s.done_at = now
        if s.phase == "retiring" and all(self.executor.stopped(w) for w in self._upstream):
            if not self._decoders_asked:  # a draining prefill worker hands its KV caches to these: they go last
                for w in self._decoders:
                    self.executor.stop(w)
                self._decoders_asked = True
            if all(self.executor.stopped(w) for w in self._decoders):
                s.phase, s.done_at = "done", now
        return s.phase != before
