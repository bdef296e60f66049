"""Fixed-timeout micro-batching (an EAServe baseline): release at B requests, or a fixed time after the
batch's first arrival, whichever comes first.

The wait is min(timeout_s, max_wait_s): A is every policy's hard cap on the oldest request's wait.
"""

from __future__ import annotations

from collections import deque

from coordinator.policies.base import Arrival, BatchPolicyConfig, Release


class FixedTimeout:
    """Size trigger at B, time trigger at first arrival + min(timeout_s, A)."""

    def __init__(self, cfg: BatchPolicyConfig | None = None) -> None:
        self.cfg = cfg or BatchPolicyConfig(name="fixed_timeout")
        self.wait_s = min(self.cfg.timeout_s, self.cfg.max_wait_s)
        self._arrived: deque[float] = deque()  # arrival time of each queued request, oldest first

    @property
    def queued(self) -> int:
        """Arrivals observed but not yet released."""
        return len(self._arrived)

    def observe(self, event: Arrival, now: float) -> None:
        self._arrived.append(now)

    def decide(self, now: float) -> list[Release]:
        b, out = self.cfg.max_batch, []
        while len(self._arrived) >= b:
            out.append(self._release(b))
        if self._arrived and now >= self._due():
            out.append(self._release(len(self._arrived)))
        return out

    def next_deadline(self, now: float) -> float | None:
        if not self._arrived:
            return None
        if len(self._arrived) >= self.cfg.max_batch:
            return now
        return max(now, self._due())

    def _due(self) -> float:
        return self._arrived[0] + self.wait_s

    def _release(self, count: int) -> Release:
        for _ in range(count):
            self._arrived.popleft()
        return Release(count)
