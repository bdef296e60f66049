"""The open micro-batch that every time-triggered dispatch policy shares.

A policy holds the arrival times of its queued requests (oldest first). It releases full batches as
soon as `trigger` requests are queued, and the whole remainder, always fewer than B, once `due()`
has passed. Subclasses only say what `trigger` and `due()` are.

Work-conserving (`cfg.work_conserving`): while the encoder is idle, whatever is queued goes out at once
(up to B, one batch: the encoder is then busy with it) and the encoder counts as busy until
`encoder_idle` says otherwise; batches are held only while it works. A missed idle signal leaves the
rule above in charge, so it degrades to the plain policy, never to a stall.
"""

from __future__ import annotations

from collections import deque

from coordinator.policies.base import Arrival, BatchPolicyConfig, Release


class OpenBatchPolicy:
    def __init__(self, cfg: BatchPolicyConfig, trigger: int) -> None:
        self.cfg = cfg
        self.trigger = trigger
        """Queued requests that make a batch go out at once (at most B)."""
        self._arrived: deque[float] = deque()
        self._encoder_free = True
        """Work-conserving: the encoder has nothing released to it (as far as the policy knows)."""

    @property
    def queued(self) -> int:
        """Arrivals observed but not yet released."""
        return len(self._arrived)

    def observe(self, event: Arrival, now: float) -> None:
        self._arrived.append(now)

    def encoder_idle(self, now: float) -> None:
        self._encoder_free = True

    def decide(self, now: float) -> list[Release]:
        out = []
        if self.cfg.work_conserving and self._encoder_free and self._arrived:
            self._encoder_free = False
            out.append(self._release(min(len(self._arrived), self.cfg.max_batch)))
        while len(self._arrived) >= self.trigger:
            out.append(self._release(min(len(self._arrived), self.cfg.max_batch)))
        if self._arrived and now >= self._due():  # what is left is below the trigger, hence below B
            out.append(self._release(len(self._arrived)))
        return out

    def next_deadline(self, now: float) -> float | None:
        if not self._arrived:
            return None
        if len(self._arrived) >= self.trigger or (self.cfg.work_conserving and self._encoder_free):
            return now
        return max(now, self._due())

    def _due(self) -> float:
        """When the open batch must go although it is not full."""
        raise NotImplementedError

    def _release(self, count: int) -> Release:
        for _ in range(count):
            self._arrived.popleft()
        return Release(count)
