"""A worker's presence in the registry: register on start, heartbeat with its load, leave on stop.

Every beat writes the worker's whole record (registry.py), so after Redis restarts or loses its contents
the worker is back in routing within one beat, with no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from coordinator.protocol.messages import WorkerInfo
from coordinator.protocol.process import cancel_and_wait
from coordinator.protocol.registry import WorkerRegistry

log = logging.getLogger(__name__)


class Presence:
    def __init__(self, registry: WorkerRegistry, info: WorkerInfo, load: Callable[[], int],
                 interval_s: float | None = None, stats: Callable[[], dict[str, float]] = dict):
        self.registry = registry
        self.info = info
        self.load = load
        self.stats = stats
        self.interval_s = registry.interval_s if interval_s is None else interval_s
        self._task: asyncio.Task | None = None
        self.draining = False
        """Set by `drain`: every beat from then on tells routing to send nothing new here."""

    async def __aenter__(self) -> "Presence":
        await self.registry.register(self.info, self.load(), self.stats())
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat-{self.info.worker_id}")
        log.info("registered", extra={"worker_id": self.info.worker_id, "role": self.info.role,
                                      "instance": self.info.instance})
        return self

    async def _beat(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.registry.heartbeat(self.info, self.load(), self.stats(), self.draining)
                if failing:
                    log.info("heartbeat restored", extra={"worker_id": self.info.worker_id})
                failing = False
            except Exception as e:  # a Redis hiccup must not kill the worker; the TTL tells the truth
                if not failing:
                    log.warning("heartbeat failed", extra={"error": str(e)})
                failing = True

    async def drain(self) -> None:
        """Stay registered (the coordinator re-runs nothing) but take no new work: beat now with the flag."""
        self.draining = True
        with contextlib.suppress(Exception):
            await self.registry.heartbeat(self.info, self.load(), self.stats(), True)
        log.info("draining", extra={"worker_id": self.info.worker_id, "held": self.load()})

    async def leave(self) -> None:
        """Stop beating and leave the registry (idempotent): nothing is routed here from now on."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        with contextlib.suppress(Exception):
            await self.registry.deregister(self.info.worker_id)

    async def __aexit__(self, *exc) -> None:
        await self.leave()
