"""The live workers as request routing sees them: one registry scan serves many dispatches.

A scan is two Redis round trips plus a parse of every worker's record; done per request, it was the
largest single cost of the coordinator's dispatch under load (benchmarks/results/coordinator_profile.md).
Dispatches that arrive while a scan is in flight share it, and a scan younger than `max_age_s` is reused.
The loads in it are what the workers last reported, every heartbeat interval (ttl/4, 500 ms by default),
so a view a few tens of milliseconds old routes as well as a fresh one. Past `max_age_s` but younger than
`stale_s` the view is still used, and a scan starts beside the request instead of before it: at light load
every request would otherwise wait for a scan of its own (two Redis round trips and a parse, ~1.2 ms of a
~40 ms TTFT here), while under load scans stay `max_age_s` apart as before. Between requests the
coordinator keeps the view younger than `stale_s` (`keep_fresh`, every `REFRESH_S`), so a request at light
load finds one it can use. A worker that died or started
draining within that age may still get a request: the failover re-runs it (its holder left the registry),
and a draining worker still serves what was routed to it, as with a scan taken just before it changed.
An empty view is never reused, so a worker that just registered is seen at once.

The encode worker routes its embeddings on a view of its own, kept fresh between batches (`keep_fresh`), for
the same reason: a scan per micro-batch ran beside every forward, on the encoder's core and under its GIL
(encode_node/worker.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from coordinator.protocol.messages import Role
from coordinator.protocol.registry import WorkerRegistry, WorkerStatus

MAX_AGE_S = 0.02
"""How long a scan is reused: 1/25 of the default heartbeat interval, ~50 scans/s at most under load."""
log = logging.getLogger(__name__)
STALE_S = 0.25
"""How old a view may still route a request while a fresh scan runs beside it: half the default heartbeat
interval, so its loads are at most one report behind."""
REFRESH_S = 0.1
"""How often `keep_fresh` scans when no request did: 10 scans/s when idle (two Redis round trips each)."""


class RoutingView:
    def __init__(self, registry: WorkerRegistry, max_age_s: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic, stale_s: float = STALE_S):
        self.registry, self.max_age_s, self.clock = registry, max_age_s, clock
        self.stale_s = max(stale_s, max_age_s)
        self._workers: list[WorkerStatus] = []
        self._at = float("-inf")
        self._scan: asyncio.Future[list[WorkerStatus]] | None = None
        self.scans = 0
        """Registry scans made (tests, and anyone checking the sharing works)."""

    async def alive(self, roles: frozenset[Role] | set[Role]) -> list[WorkerStatus]:
        """The routable (live, not draining) workers of `roles`, sorted by id, as WorkerRegistry.alive says."""
        age = self.clock() - self._at
        if not self._workers or age > self.stale_s:
            # shield: a caller cancelled (client gone) must not cancel the scan the others wait on
            await asyncio.shield(self._start_scan())
        elif age > self.max_age_s:
            self._start_scan()  # beside this request: it routes on the view it has
        return [w for w in self._workers if w.info.role in roles]

    async def rescan(self, roles: frozenset[Role] | set[Role]) -> list[WorkerStatus]:
        """`alive` from a scan started now (or one already running): for a caller that just found a worker of the
        view gone."""
        await asyncio.shield(self._start_scan())
        return [w for w in self._workers if w.info.role in roles]

    @property
    def age_s(self) -> float:
        """Seconds since the view's scan started (inf before the first)."""
        return self.clock() - self._at

    async def keep_fresh(self, every_s: float = REFRESH_S) -> None:
        """Forever: scan whenever the view is `every_s` old, so requests between scans route without waiting.
        A failing scan (Redis down) is logged once until one succeeds; requests then wait for their own."""
        failing = False
        while True:
            if self.age_s >= every_s:
                try:
                    await asyncio.shield(self._start_scan())
                    if failing:
                        log.info("worker registry readable again")
                    failing = False
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    if not failing:
                        log.warning("worker registry unreadable; retrying", extra={"error": str(e)})
                    failing = True
            await asyncio.sleep(every_s)

    def _start_scan(self) -> asyncio.Future[list[WorkerStatus]]:
        if self._scan is None:
            self._scan = asyncio.ensure_future(self._refresh())
            # a scan nobody awaits (started beside a request) must not log "exception never retrieved"; the
            # next request past stale_s awaits a scan of its own and sees the error then
            self._scan.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._scan

    async def _refresh(self) -> list[WorkerStatus]:
        started = self.clock()  # the view's age counts from before the scan read anything
        try:
            workers = await self.registry.alive()
            self._workers, self._at = workers, started
            self.scans += 1
            return workers
        finally:
            self._scan = None
