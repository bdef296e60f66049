"""The re-planner: every window, is the plan in force still right for the forecast workload?

A pure decision object with an injected clock. It is given two functions: `utilisation(plan, forecast)`, the
busiest stage's load (rho) the plan would run at under the forecast (the queueing model over the current
profiles, planner_bridge.py), and `search(forecast, incumbent)`, a new plan for the forecast, warm-started
from the plan in force (the incumbent every candidate must beat): over the planner, HAS runs the incumbent and
its neighbours (one GPU more or less per role, s +- 0.1) first and returns the incumbent itself unless
something beats it on the prediction stream (coordinator/planner/warm_start.py). It re-plans when

- the forecast utilisation leaves the band [low, high] for `sustain_windows` windows in a row (hysteresis:
  one noisy window does nothing, and a new plan is searched for the band's middle, so it does not sit at an
  edge), and
- at least `min_dwell_s` passed since the last switch (and since start), so it never flaps;

below the band the candidate must also be cheaper by `cheaper_margin`, or it is not worth a switch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coordinator.oserve.workload_forecast import WorkloadForecast

P = TypeVar("P")


class ReplanConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    low: float = Field(0.35, ge=0)
    """Below this utilisation the plan pays for idle GPUs: look for a cheaper one."""
    high: float = Field(0.85, gt=0)
    """Above this utilisation latency climbs towards the SLO: look for a bigger one."""
    sustain_windows: int = Field(3, ge=1)
    """Consecutive out-of-band windows before a re-plan (hysteresis against noise)."""
    min_dwell_s: float = Field(300.0, ge=0)
    """Seconds a plan stays in force at least (OServe's switch costs ~30 s; switching more often wastes it)."""
    cheaper_margin: float = Field(0.1, ge=0, lt=1)
    """Below the band, the new plan must cost this share less per hour than the one in force."""

    @model_validator(mode="after")
    def _band(self) -> ReplanConfig:
        if self.low >= self.high:
            raise ValueError(f"the band needs low < high, got low={self.low} high={self.high}")
        return self


@dataclass(frozen=True)
class Decision(Generic[P]):
    """What the re-planner concluded this window, and why (the dry run prints it)."""

    action: Literal["keep", "switch"]
    reason: str
    utilisation: float
    """The plan in force's busiest-stage load under the forecast."""
    plan: P | None = None
    """The new plan, when switching."""


class Replanner(Generic[P]):
    def __init__(self, config: ReplanConfig, plan: P, utilisation: Callable[[P, WorkloadForecast], float],
                 search: Callable[[WorkloadForecast, P], P | None], cost: Callable[[P], float], now: float) -> None:
        self.config = config
        self.plan = plan
        self.utilisation = utilisation
        self.search = search
        self.cost = cost
        self.since = now
        """When the plan in force was put in force (or the re-planner started)."""
        self.streak = 0
        self.side: str | None = None
        self.switches = 0

    def step(self, now: float, forecast: WorkloadForecast) -> Decision[P]:
        """One window's decision; a "switch" is taken as done (the caller applies it)."""
        c = self.config
        u = self.utilisation(self.plan, forecast)
        side = "over" if u > c.high else "under" if u < c.low else None
        self.streak = self.streak + 1 if side is not None and side == self.side else (1 if side else 0)
        self.side = side
        where = f"utilisation {u:.2f} under the forecast ({forecast.rate:.2f} req/s)"
        if side is None:
            return Decision("keep", f"{where} is inside the band [{c.low}, {c.high}]", u)
        if self.streak < c.sustain_windows:
            return Decision("keep", f"{where} is {side} the band for {self.streak} of {c.sustain_windows} windows", u)
        if now - self.since < c.min_dwell_s:
            return Decision("keep", f"{where} is {side} the band, but the plan has been in force only "
                                    f"{now - self.since:.0f} s of the {c.min_dwell_s:.0f} s dwell", u)
        candidate = self.search(forecast, self.plan)
        if candidate is None or candidate == self.plan:
            self.since = now  # searched and nothing better: wait a dwell before searching again
            return Decision("keep", f"{where} is {side} the band, but the search found no better plan", u)
        old, new = self.cost(self.plan), self.cost(candidate)
        if side == "under" and new > old * (1 - c.cheaper_margin):
            self.since = now
            return Decision("keep", f"{where} is under the band, but the best plan found costs ${new:.2f}/h vs "
                                    f"${old:.2f}/h, not {c.cheaper_margin:.0%} less", u)
        self.plan, self.since, self.streak, self.side = candidate, now, 0, None
        self.switches += 1
        return Decision("switch", f"{where} was {side} the band for {c.sustain_windows} windows; new plan "
                                  f"${new:.2f}/h (was ${old:.2f}/h)", u, candidate)
