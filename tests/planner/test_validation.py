"""The planner's final pick: its finalists re-run on the prediction stream, the best of them kept."""

from __future__ import annotations

from coordinator.planner.goodput import SLO
from coordinator.planner.planning import PlanRequest, make_plan, pick, prepare, search
from coordinator.planner.trials import TrialOutcome
from coordinator.planner.validation import finalists


def test_the_pick_is_the_best_finalist_on_fresh_traffic():
    ctx = prepare(PlanRequest(model="qwen2.5-vl-7b", modality="video", rate=9, slo=SLO(ttft_s=5, tpot_s=0.1),
                              gpus="2xRTX4090,2xA100", requests_per_trial=40, prediction_requests=120))
    result = search(ctx, "has", trials=8)
    top = finalists(result, 3)
    assert len({r.config.label() for r in top}) == len(top) and top[0].outcome.rank_key() <= top[-1].outcome.rank_key()
    record, _, predicted = pick(ctx, result)
    assert record in top
    for other in top:  # no finalist does better than the pick on the prediction stream (ties: within 1 %)
        _, summary = ctx.backend.run(other.config, requests=120, seed=1)
        outcome = TrialOutcome.from_summary(summary, other.config.allocation.cost_per_hour(ctx.catalog), "sim")
        assert predicted.objective >= outcome.objective * 0.99
    plan = make_plan(ctx, result)
    assert plan.search.best_trial == record.number and plan.predicted.objective == predicted.objective
