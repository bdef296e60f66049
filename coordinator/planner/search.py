"""Search results, and the two baselines HAS is compared with (EAServe): Random and Coordinate search.

Both baselines get the same trial budget and the same backend as HAS, and search the UNPRUNED space:
every allocation the queueing model finds feasible (no stage-1 ranking, no top-K), B in [1, ceil(Lambda)],
s in [0, 1]. What HAS adds is stage 1's pruning and seeding plus TPE; the comparison measures that.

- Random: each trial draws an allocation uniformly, then its knobs uniformly.
- Coordinate: from a random point, sweep one coordinate at a time (allocation, B, s, split, stealing),
  trying a few values of it with the others fixed and moving to the best; an allocation sweep tries
  `points` other allocations drawn at random (there may be hundreds). Points already tried are not
  tried again; when a whole cycle finds nothing new to try, it restarts from a random point.
Baselines run their whole budget: the stopping rules are part of HAS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.space import Knobs, KnobSpace, TrialConfig, spaces_by_label
from coordinator.planner.trials import TrialBackend, TrialOutcome

KNOBS = ("batch", "s", "split", "stealing")


class TrialRecord(BaseModel):
    """One trial of a search."""

    model_config = ConfigDict(frozen=True)

    number: int = Field(ge=0)
    """Position in the search, from 0."""
    config: TrialConfig
    """What was deployed."""
    outcome: TrialOutcome
    """What it scored."""
    seeded: bool = False
    """An enqueued seed (HAS: B_max, s*), not a sampler's proposal."""


class SearchResult(BaseModel):
    """A finished search: every trial in order and why it ended."""

    model_config = ConfigDict(frozen=True)

    method: str
    """has, random or coordinate."""
    budget: int = Field(ge=1)
    """Trials allowed."""
    records: tuple[TrialRecord, ...]
    """The trials run, in order (for a resumed HAS study, the earlier runs' trials too)."""
    stop_reason: str | None = None
    """Which stopping rule ended it early; None when it used the whole budget."""

    def best(self, tie_tolerance: float = 0.01) -> TrialRecord:
        """The winner: highest objective, ties broken by mean TTFT, then mean TPOT (the seeds' rule).

        Objectives within `tie_tolerance` (relative) of the highest count as tied: the stopping rule calls
        trials that close converged, and at a fixed rate goodput saturates, so what is left between them
        is run-length noise (the drain after the last arrival), not a better configuration."""
        if not self.records:
            raise ValueError(f"the {self.method} search ran no trial; give it a budget of at least 1")
        top = max(r.outcome.objective for r in self.records)
        tied = [r for r in self.records if r.outcome.objective >= top * (1 - tie_tolerance)]
        return min(tied, key=lambda r: (r.outcome.ttft_mean_s, r.outcome.tpot_mean_s, -r.outcome.objective, r.number))

    def best_so_far(self) -> list[float]:
        """Best objective after each trial (the efficiency curves of the benchmark)."""
        out, best = [], 0.0
        for r in self.records:
            best = max(best, r.outcome.objective)
            out.append(best)
        return out


OnTrial = Callable[[TrialRecord], None]
"""Called after every trial (a progress bar, a log line)."""


class _Runner:
    """Counts the budget and collects records for one baseline search."""

    def __init__(self, backend: TrialBackend, budget: int, on_trial: OnTrial | None) -> None:
        if budget < 1:
            raise ValueError(f"a search needs a budget of at least 1 trial, got {budget}")
        self.backend, self.budget, self.on_trial = backend, budget, on_trial
        self.records: list[TrialRecord] = []
        self.tried: dict[str, TrialOutcome] = {}

    @property
    def left(self) -> int:
        return self.budget - len(self.records)

    def run(self, config: TrialConfig) -> TrialOutcome:
        outcome = self.backend.evaluate(config)
        record = TrialRecord(number=len(self.records), config=config, outcome=outcome)
        self.records.append(record)
        self.tried[config.label()] = outcome
        if self.on_trial is not None:
            self.on_trial(record)
        return outcome

    def result(self, method: str) -> SearchResult:
        return SearchResult(method=method, budget=self.budget, records=tuple(self.records))


def random_search(spaces: Sequence[KnobSpace], backend: TrialBackend, budget: int, seed: int = 0,
                  on_trial: OnTrial | None = None) -> SearchResult:
    """Uniform random allocation, then uniform random knobs, `budget` times."""
    if not spaces:
        raise ValueError("random search needs at least one allocation to search")
    rng = np.random.default_rng(seed)
    runner = _Runner(backend, budget, on_trial)
    while runner.left:
        space = spaces[int(rng.integers(len(spaces)))]
        runner.run(TrialConfig(allocation=space.allocation, knobs=space.sample(rng)))
    return runner.result("random")


def _moves(space: KnobSpace, knobs: Knobs, coordinate: str, points: int) -> list[Knobs]:
    return [knobs.model_copy(update={coordinate: v}) for v in space.values(coordinate, points)
            if v != getattr(knobs, coordinate)]


def coordinate_search(spaces: Sequence[KnobSpace], backend: TrialBackend, budget: int, seed: int = 0,
                      on_trial: OnTrial | None = None, points: int = 5) -> SearchResult:
    """One coordinate at a time from a random start; see the module docstring."""
    by_label = spaces_by_label(spaces)
    labels = list(by_label)
    if not labels:
        raise ValueError("coordinate search needs at least one allocation to search")
    rng = np.random.default_rng(seed)
    runner = _Runner(backend, budget, on_trial)

    def restart() -> tuple[TrialConfig, TrialOutcome] | None:
        for _ in range(100):
            space = by_label[labels[int(rng.integers(len(labels)))]]
            config = TrialConfig(allocation=space.allocation, knobs=space.sample(rng))
            if config.label() not in runner.tried:
                return config, runner.run(config)
        return None

    start = restart()
    if start is None:
        return runner.result("coordinate")
    current, current_out = start
    while runner.left:
        moved_or_tried = False
        for coordinate in ("allocation", *KNOBS):
            space = by_label[current.allocation.label()]
            if coordinate == "allocation":
                others = [lb for lb in labels if lb != current.allocation.label()]
                picks = others if len(others) <= points else [others[i] for i in rng.choice(
                    len(others), size=points, replace=False)]
                trials = [TrialConfig(allocation=by_label[lb].allocation, knobs=by_label[lb].clip(current.knobs))
                          for lb in picks]
            else:
                trials = [TrialConfig(allocation=current.allocation, knobs=k)
                          for k in _moves(space, current.knobs, coordinate, points)]
            best, best_out = current, current_out
            for config in trials:
                if not runner.left:
                    break
                if config.label() in runner.tried:
                    continue
                moved_or_tried = True
                outcome = runner.run(config)
                if outcome.rank_key() < best_out.rank_key():
                    best, best_out = config, outcome
            current, current_out = best, best_out
            if not runner.left:
                break
        if not moved_or_tried and runner.left:
            start = restart()
            if start is None:
                break
            current, current_out = start
    return runner.result("coordinate")
