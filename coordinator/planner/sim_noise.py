"""Host noise in the simulator: the machine runs faster or slower from one moment to the next.

A live worker's compute does not take the same time twice: other processes, caches and clocks make a host run
slower or faster for a while. Without it the simulated latency spreads are narrower than live ones (at the
lowest rate, where queueing is small, epd's live TTFT p10/p50/p75/p90 was 29/32/41/49 ms against a simulated
31/32/34/38), and under a tight SLO the simulator is optimistic.

`HostNoise` models it as a host-speed factor: every encoder forward, prefill and decode step (not transfers, not
the stack's hops) takes `factor` times as long as the profile says, where the factor is lognormal with median 1
and log-sd `sigma`, constant over a window of `period_s` of simulated time and drawn anew, independently, for
each window. The factor of a window depends only on (seed, window index), so a run is reproducible whatever
order the simulation asks in. Evidence and the fitted values: benchmarks/results/sim_fidelity_noise_trial/. The
fidelity benchmark also reads a live run's own sigma and period from its workers' timers (how widely the requests'
mean decode steps spread, and how alike neighbours are; benchmarks/sim_fidelity_noise.py).

`HostTrace` is the host's speed as it was measured over a live run rather than drawn: one factor per window of
`window_s` for the encoder's forwards and one for the LLM workers' steps, read from the workers' own compute
timers (benchmarks/sim_fidelity_trace.py), so a simulation of that run follows the host's phases within it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.planner.service import Modality, ServiceTimes


@dataclass(frozen=True)
class HostNoise:
    sigma: float
    """Log-sd of the host-speed factor (0: no noise)."""
    period_s: float
    """Seconds of simulated time one factor lasts."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma must be a finite number >= 0, got sigma={self.sigma!r}")
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise ValueError(f"period_s must be a finite number of seconds > 0, got period_s={self.period_s!r}")


SPEED_STAGES = ("encode", "llm")
"""What a HostTrace times apart: the encoder's forwards, and the LLM workers' prefill and decode steps."""


@dataclass(frozen=True)
class HostTrace:
    window_s: float
    """Seconds of simulated time (from the run's start, the first request's arrival included) one factor lasts."""
    encode: tuple[float, ...]
    """The encoder's factor per window (the last one holds past the end)."""
    llm: tuple[float, ...]
    """The LLM workers' factor per window (the last one holds past the end)."""

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window_s must be a finite number of seconds > 0, got window_s={self.window_s!r}")
        for stage in SPEED_STAGES:
            factors = getattr(self, stage)
            if not factors or any(not (f > 0 and math.isfinite(f)) for f in factors):
                raise ValueError(f"{stage} needs at least one factor, each a finite number > 0, got {factors!r}")

    def window(self, t: float) -> int:
        """The window simulated time `t` falls in (before 0: the first)."""
        return max(0, math.floor(t / self.window_s))

    def at(self, stage: str, t: float) -> float:
        factors = getattr(self, stage)
        return factors[min(self.window(t), len(factors) - 1)]


class HostSpeed:
    """The factor at the simulation's current time (`clock`, seconds): `noise`'s draw times `trace`'s measured
    factor for the stage, either of them absent."""

    def __init__(self, noise: HostNoise | None, clock: Callable[[], float], trace: HostTrace | None = None) -> None:
        self.noise = noise
        self.trace = trace
        self.clock = clock
        self._factors: dict[int, float] = {}

    def factor(self, stage: str = "llm") -> float:
        """The host's factor now for `stage` (SPEED_STAGES)."""
        measured = self.trace.at(stage, self.clock()) if self.trace is not None else 1.0
        return measured * self._drawn()

    def _drawn(self) -> float:
        if self.noise is None or self.noise.sigma == 0:
            return 1.0
        window = math.floor(self.clock() / self.noise.period_s)
        f = self._factors.get(window)
        if f is None:
            rng = random.Random(f"{self.noise.seed}:{window}")  # by (seed, window): order-independent
            f = self._factors[window] = math.exp(rng.gauss(0.0, self.noise.sigma))
        return f


class NoisyService:
    """`inner`'s service times, its compute stages (encode, prefill, decode step) scaled by `speed.factor(...)`;
    everything else (transfers, the stack's hops and CPU, `under_load`'s other figures) as `inner` has it."""

    def __init__(self, inner: ServiceTimes, speed: HostSpeed) -> None:
        self.inner = inner
        self.speed = speed

    def encode_s(self, tier: str, modality: Modality, batch: int, tokens_per_item: int) -> float:
        return self.inner.encode_s(tier, modality, batch, tokens_per_item) * self.speed.factor("encode")

    def prefill_s(self, tier: str, tokens: int) -> float:
        return self.inner.prefill_s(tier, tokens) * self.speed.factor("llm")

    def prefill_batch_s(self, tier: str, lengths: Sequence[int]) -> float:
        batch = getattr(self.inner, "prefill_batch_s", None)
        seconds = batch(tier, lengths) if batch is not None else self.inner.prefill_s(tier, sum(lengths))
        return seconds * self.speed.factor("llm")

    def decode_step_s(self, tier: str, batch: int, context_tokens: int) -> float:
        return self.inner.decode_step_s(tier, batch, context_tokens) * self.speed.factor("llm")

    def transfer_s(self, nbytes: int, src_tier: str, dst_tier: str, same_host: bool) -> float:
        return self.inner.transfer_s(nbytes, src_tier, dst_tier, same_host)

    def without_overheads(self) -> NoisyService:
        """The inner service's compute alone (Simulator(record_compute=True)), at the same host speed."""
        return NoisyService(self.inner.without_overheads(), self.speed)

    def __getattr__(self, name: str) -> Any:  # optional extras (request_hops_s, stack_cpu_s, ...) pass through
        return getattr(self.inner, name)
