"""The live workers as request routing sees them: one registry scan serves many dispatches.

A scan is two Redis round trips plus a parse of every worker's record; done per request, it was the
largest single cost of the coordinator's dispatch under load (benchmarks/results/coordinator_profile.md).
Dispatches that arrive while a scan is in flight share it, and a scan younger than `max_age_s` is reused.
The loads in it are what the workers last reported, every heartbeat interval (ttl/4, 500 ms by default),
so a view a few tens of milliseconds old routes as well as a fresh one. A worker that died or started
draining within that age may still get a request: the failover re-runs it (its holder left the registry),
and a draining worker still serves what was routed to it, as with a scan taken just before it changed.
An empty view is never reused, so a worker that just registered is seen at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from coordinator.protocol.messages import Role
from coordinator.protocol.registry import WorkerRegistry, WorkerStatus

MAX_AGE_S = 0.02
"""How long a scan is reused: 1/25 of the default heartbeat interval, ~50 scans/s at most under load."""


class RoutingView:
    def __init__(self, registry: WorkerRegistry, max_age_s: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.registry, self.max_age_s, self.clock = registry, max_age_s, clock
        self._workers: list[WorkerStatus] = []
        self._at = float("-inf")
        self._scan: asyncio.Future[list[WorkerStatus]] | None = None
        self.scans = 0
        """Registry scans made (tests, and anyone checking the sharing works)."""

    async def alive(self, roles: frozenset[Role] | set[Role]) -> list[WorkerStatus]:
        """The routable (live, not draining) workers of `roles`, sorted by id, as WorkerRegistry.alive says."""
        if not self._workers or self.clock() - self._at > self.max_age_s:
            if self._scan is None:
                self._scan = asyncio.ensure_future(self._refresh())
            # shield: a caller cancelled (client gone) must not cancel the scan the others wait on
            await asyncio.shield(self._scan)
        return [w for w in self._workers if w.info.role in roles]

    async def _refresh(self) -> list[WorkerStatus]:
        started = self.clock()  # the view's age counts from before the scan read anything
        try:
            workers = await self.registry.alive()
            self._workers, self._at = workers, started
            self.scans += 1
            return workers
        finally:
            self._scan = None
