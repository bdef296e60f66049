"""Pass-through dispatch (B=1 in EAServe's terms): every arrival is released alone, at once.

Every stream entry is one micro-batch, so the encoder runs every request on its own (Dynamo's encode
worker, EAServe's B=1). This is the baseline the others are measured against.
"""

from __future__ import annotations

from coordinator.policies.base import Arrival, BatchPolicyConfig, Release


class PassThrough:
    """Release(1) per arrival; holds nothing back, so it never needs a timer."""

    def __init__(self, cfg: BatchPolicyConfig | None = None) -> None:
        self.cfg = cfg or BatchPolicyConfig(name="pass_through")
        self._queued = 0

    @property
    def queued(self) -> int:
        """Arrivals observed but not yet released."""
        return self._queued

    def observe(self, event: Arrival, now: float) -> None:
        self._queued += 1

    def decide(self, now: float) -> list[Release]:
        out, self._queued = [Release(1)] * self._queued, 0
        return out

    def next_deadline(self, now: float) -> float | None:
        return now if self._queued else None

    def encoder_idle(self, now: float) -> None:
        """Nothing is ever held back, so an idle encoder changes nothing."""
