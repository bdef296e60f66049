"""EAServe's load-adaptive micro-batching: hold the open batch while more requests are likely to come soon.

With arrivals assumed Poisson at rate λ, the B-1 gaps after a batch's first request are all shorter than
g with probability (1 - e^(-λg))^(B-1). Setting that to the target fill probability p gives

    g = κ / λ,   κ = -ln(1 - p^(1/(B-1)))

so the idle threshold g tightens as load rises and relaxes as it falls, while κ depends only on the
knobs. The open batch goes out when it reaches B requests, OR no request arrived for g seconds, OR its
first request has waited A (the hard cap for the pathological stream that lands each request just
before g). B=1 is pass-through (κ = 0, the limit of the formula). While λ is unknown (fewer than
`min_samples` arrivals in the rate window) nothing is held: every batch goes out at once.

λ, and with it g, is refreshed on every arrival (the moment it changes what to do next), so a
deadline handed out by `next_deadline` stays valid until the next event.
"""

from __future__ import annotations

import math

from coordinator.policies.base import Arrival, BatchPolicyConfig
from coordinator.policies.open_batch import OpenBatchPolicy
from coordinator.policies.rate import ArrivalRate


def idle_kappa(max_batch: int, fill_probability: float) -> float:
    """κ = -ln(1 - p^(1/(B-1))); 0 for B=1. Computed via expm1 so it stays exact for large B."""
    if max_batch < 1 or not 0.0 < fill_probability < 1.0:
        raise ValueError(f"need B >= 1 and 0 < p < 1, got B={max_batch} p={fill_probability}")
    if max_batch == 1:
        return 0.0
    return -math.log(-math.expm1(math.log(fill_probability) / (max_batch - 1)))


class AdaptiveMicroBatch(OpenBatchPolicy):
    """Size trigger at B, idle trigger g = κ/λ after the last arrival, hard cap A after the first."""

    def __init__(self, cfg: BatchPolicyConfig | None = None, *, max_rate_samples: int = 1024) -> None:
        cfg = cfg or BatchPolicyConfig(name="adaptive")
        super().__init__(cfg, cfg.max_batch)
        self._kappa = idle_kappa(cfg.max_batch, cfg.fill_probability)
        self._estimator = ArrivalRate(cfg.rate_window_s, cfg.min_samples, max_rate_samples)
        self._rate: float | None = None
        self._g: float | None = None

    @property
    def kappa(self) -> float:
        """κ: the idle threshold in units of the mean inter-arrival time."""
        return self._kappa

    @property
    def rate(self) -> float | None:
        """λ (arrivals/s) as estimated at the last arrival; None while unknown."""
        return self._rate

    @property
    def idle_threshold(self) -> float | None:
        """g = κ/λ in seconds, as of the last arrival; None while λ is unknown (batches go out at once)."""
        return self._g

    def observe(self, event: Arrival, now: float) -> None:
        super().observe(event, now)
        self._estimator.observe(now)
        self._rate = self._estimator.rate(now)
        self._g = None if self._rate is None else self._kappa / self._rate

    def _due(self) -> float:
        """When the open batch (< B requests) must go: idle for g since the last arrival, or A since the first.

        An unknown rate counts as g = 0, i.e. due at the last arrival, which has already happened.
        """
        g = 0.0 if self._g is None else self._g
        return min(self._arrived[-1] + g, self._arrived[0] + self.cfg.max_wait_s)
