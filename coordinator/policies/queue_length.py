"""Queue-length trigger (an EAServe baseline): release as soon as `queue_length` requests are queued.

The threshold is capped at B (a batch can never hold more), and the hard cap A still applies: a
request that the threshold would hold at low load goes out once the oldest queued one has waited A.
"""

from __future__ import annotations

from collections import deque

from coordinator.policies.base import Arrival, BatchPolicyConfig, Release


class QueueLengthTrigger:
    """Release min(queued, B) once min(queue_length, B) are queued; or everything queued at first arrival + A."""

    def __init__(self, cfg: BatchPolicyConfig | None = None) -> None:
        self.cfg = cfg or BatchPolicyConfig(name="queue_length")
        self.threshold = min(self.cfg.queue_length, self.cfg.max_batch)
        self._arrived: deque[float] = deque()  # arrival time of each queued request, oldest first

    @property
    def queued(self) -> int:
        """Arrivals observed but not yet released."""
        return len(self._arrived)

    def observe(self, event: Arrival, now: float) -> None:
        self._arrived.append(now)

    def decide(self, now: float) -> list[Release]:
        out = []
        while len(self._arrived) >= self.threshold:
            out.append(self._release(min(len(self._arrived), self.cfg.max_batch)))
        # What is left is below the threshold, hence below B: one batch.
        if self._arrived and now >= self._due():
            out.append(self._release(len(self._arrived)))
        return out

    def next_deadline(self, now: float) -> float | None:
        if not self._arrived:
            return None
        if len(self._arrived) >= self.threshold:
            return now
        return max(now, self._due())

    def _due(self) -> float:
        return self._arrived[0] + self.cfg.max_wait_s

    def _release(self, count: int) -> Release:
        for _ in range(count):
            self._arrived.popleft()
        return Release(count)
