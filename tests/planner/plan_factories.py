"""Factory helpers for the planner's search tests: trial outcomes, knob spaces, scripted backends."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from coordinator.planner.allocation import parse_allocation
from coordinator.planner.space import KnobSpace, TrialConfig, s_is_a_knob
from coordinator.planner.trials import TrialOutcome


def outcome(objective: float, ttft: float = 1.0, tpot: float = 0.01, cost: float = 1.0) -> TrialOutcome:
    """An outcome with `objective` good requests per dollar at `cost` $/h."""
    goodput = objective * cost / 3600.0
    return TrialOutcome(objective=objective, goodput_rps=goodput, throughput_rps=max(goodput, 1.0),
                        slo_attainment=1.0 if objective else 0.0, ttft_mean_s=ttft, ttft_p50_s=ttft, ttft_p99_s=ttft,
                        tpot_mean_s=tpot, tpot_p99_s=tpot, cost_per_hour=cost,
                        cost_per_goodput=cost / (goodput * 3600) if goodput else math.inf, requests=100,
                        backend="fake")


def space(spec: str, b_max: int = 4, s_range: tuple[float, float] | None = None, s_star: float | None = None,
          can_steal: bool = False) -> KnobSpace:
    """A knob space over the allocation `spec` ("1xL4:E,1xL4:P+D")."""
    alloc = parse_allocation(spec)
    if s_is_a_knob(alloc) and s_range is None:
        s_range, s_star = (0.3, 0.7), 0.5
    return KnobSpace(allocation=alloc, b_max=b_max, s_range=s_range, s_star=s_star, can_steal=can_steal)


SPACES = (
    space("1xL4:E,1xL4:P+D", can_steal=True),
    space("1xL4:E+P,1xL4:P,1xL4:D", b_max=3, s_range=(0.2, 0.6), s_star=0.4),
    space("1xL4:E,1xL4:P,1xL4:D", b_max=2),
)


class ScriptedBackend:
    """A trial backend whose objective is `score(config)`, or the next value of `script` per call."""

    name = "fake"

    def __init__(self, score: Callable[[TrialConfig], float] | None = None, script: Sequence[float] = ()) -> None:
        self.score = score
        self.script = list(script)
        self.calls: list[TrialConfig] = []

    def evaluate(self, config: TrialConfig) -> TrialOutcome:
        self.calls.append(config)
        if self.score is not None:
            return outcome(self.score(config))
        return outcome(self.script[min(len(self.calls), len(self.script)) - 1])


def smooth_score(config: TrialConfig) -> float:
    """A surface with one best point per allocation: B = 2, s = 0.5, dynamic split, no stealing."""
    k = config.knobs
    base = {"1xL4:E,1xL4:P+D": 1000.0, "1xL4:E+P,1xL4:P,1xL4:D": 1200.0}.get(config.allocation.label(), 800.0)
    return base - 50 * abs(k.batch - 2) - 400 * abs(k.s - 0.5) - (30 if k.split != "dynamic" else 0) - 20 * k.stealing
