"""A worker's presence in the registry: register on start, heartbeat with its load, leave on stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from coordinator.protocol.messages import WorkerInfo
from coordinator.protocol.registry import WorkerRegistry

log = logging.getLogger(__name__)


class Presence:
    def __init__(self, registry: WorkerRegistry, info: WorkerInfo, load: Callable[[], int],
                 interval_s: float = 2.0, stats: Callable[[], dict[str, float]] = dict):
        self.registry = registry
        self.info = info
        self.load = load
        self.stats = stats
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Presence":
        await self.registry.register(self.info, self.load(), self.stats())
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat-{self.info.worker_id}")
        log.info("registered", extra={"worker_id": self.info.worker_id, "role": self.info.role})
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.registry.heartbeat(self.info.worker_id, self.load(), self.stats())
            except Exception as e:  # a Redis hiccup must not kill the worker; the TTL tells the truth
                log.warning("heartbeat failed", extra={"error": str(e)})

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.registry.deregister(self.info.worker_id)
