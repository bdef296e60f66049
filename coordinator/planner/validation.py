"""The planner's final pick: the search's best few trials re-run on a longer stream, the best of those kept.

A trial replays ~100 requests, so two configurations within a few percent of each other on that
stream are not told apart by it (the planner suite saw B=10 beat B=8 on the trial stream and lose on
fresh traffic). The plan's prediction already re-simulates the winner on `prediction_requests` unseen
requests; here the top `top` distinct configurations all get that run and the best by the seeds'
rule (objective within 1 %, then mean TTFT, then mean TPOT) becomes the plan. Simulator trials only:
a live search's ranking comes from the live cluster and is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.planner.goodput import Summary
from coordinator.planner.search import SearchResult, TrialRecord
from coordinator.planner.space import TrialConfig
from coordinator.planner.trials import TrialOutcome

Predict = Callable[[TrialConfig], tuple[object, Summary]]
"""Runs one configuration on the prediction stream; returns (deployment, summary)."""


def finalists(result: SearchResult, top: int) -> list[TrialRecord]:
    """The `top` best trials with distinct configurations, best first."""
    seen: dict[str, TrialRecord] = {}
    for r in sorted(result.records, key=lambda r: (r.outcome.rank_key(), r.number)):
        seen.setdefault(r.config.label(), r)
    return list(seen.values())[:top]


def validated_best(result: SearchResult, predict: Predict, price: Callable[[TrialConfig], float], top: int = 3,
                   tie_tolerance: float = 0.01) -> tuple[TrialRecord, object, TrialOutcome]:
    """(trial, deployment, predicted outcome) of the finalist that does best on the prediction stream."""
    best = result.best(tie_tolerance)
    pool = [best] if best.outcome.backend != "sim" else [best, *(r for r in finalists(result, top) if r is not best)]
    runs = []
    for record in pool[:max(1, top)]:
        dep, summary = predict(record.config)
        runs.append((record, dep, TrialOutcome.from_summary(summary, price(record.config), "sim")))
    peak = max(o.objective for _, _, o in runs)
    tied = [run for run in runs if run[2].objective >= peak * (1 - tie_tolerance)]
    return min(tied, key=lambda run: (run[2].ttft_mean_s, run[2].tpot_mean_s, -run[2].objective, run[0].number))
