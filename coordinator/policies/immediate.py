"""Pass-through dispatch (B=1 in EAServe's terms): every arrival is released at once.

Batching still happens downstream: the encode worker takes whatever has queued on its stream
(up to its cap) while it was busy, so under load requests share forward passes.
"""

from __future__ import annotations

from coordinator.policies.base import Arrival, Release


class ImmediateRelease:
    def __init__(self) -> None:
        self.pending = 0

    def observe(self, event: Arrival, now: float) -> None:
        self.pending += 1

    def decide(self, now: float) -> list[Release]:
        if not self.pending:
            return []
        out, self.pending = [Release(self.pending)], 0
        return out

    def next_deadline(self, now: float) -> float | None:
        return None


POLICIES = {"immediate": ImmediateRelease}
