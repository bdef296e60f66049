"""The simulator's clock: a heap of (time, sequence number, callback, argument).

The sequence number makes equal times run in the order they were scheduled, which keeps runs
deterministic and never compares callbacks. Cancellation is lazy: whoever may cancel an event
schedules it with a version number and ignores it when the version has moved on.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    """Discrete-event loop: `at` schedules, `run` pops in time order until nothing is left."""

    def __init__(self) -> None:
        self.now = 0.0
        """The current simulated time (seconds); only `run` advances it."""
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.processed = 0
        """Events run so far (a cost measure for the performance budget)."""

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run fn(arg) at time t (never before now)."""
        if t < self.now:
            raise ValueError(f"cannot schedule in the past: t={t!r} < now={self.now!r}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, arg))

    def next_time(self) -> float:
        """Time of the earliest pending event; inf when none."""
        return self._heap[0][0] if self._heap else float("inf")

    def run(self) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap:
            t, _, fn, arg = pop(heap)
            self.now = t
            self.processed += 1
            fn(arg)
