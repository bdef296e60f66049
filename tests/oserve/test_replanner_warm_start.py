"""The re-planner's warm start (issue 16): the search runs the plan in force and its neighbours first, reaches a
known-better nearby plan in fewer evaluations than a cold search, and never returns a plan worse than the plan
in force while that plan keeps up. Real planner, real simulator; the known-better plan is what a long search
(40 trials, no stopping, another sampler seed) finds, and the plan in force is it with one GPU too many (the
plan made for a higher load, after the load fell)."""

from __future__ import annotations

import pytest

from coordinator.planner.goodput import SLO
from coordinator.planner.planning import (
    PlanContext,
    PlanRequest,
    make_plan,
    pick,
    prepare,
    search,
)
from coordinator.planner.space import TrialConfig
from coordinator.planner.stopping import StoppingConfig
from coordinator.planner.warm_start import (
    evaluations_to_reach,
    neighbours,
    plan_config,
    warm_pick,
    warm_plan,
    warm_search,
)

CASES = {
    "llava image": ("llava-1.5-7b", "image", 8.0, SLO(ttft_s=2.0, tpot_s=0.1)),
    "qwen video": ("qwen2.5-vl-7b", "video", 6.0, SLO(ttft_s=5.0, tpot_s=0.1)),
}
POOL = "2xRTX4090,2xA100"


@pytest.fixture(scope="module", params=list(CASES))
def case(request) -> tuple[PlanContext, TrialConfig, list[TrialConfig]]:
    """(context, the known-better plan, plans in force one GPU bigger than it that the pool can hold)."""
    model, modality, rate, slo = CASES[request.param]
    ctx = prepare(PlanRequest(model=model, modality=modality, rate=rate, slo=slo, gpus=POOL, requests_per_trial=60,
                              prediction_requests=200))
    best = search(ctx, "has", trials=40, seed=1, stopping=StoppingConfig(enabled=False)).best().config
    bigger = [n for n in neighbours(ctx, best)
              if n.knobs == best.knobs and n.allocation.gpus == best.allocation.gpus + 1]
    assert bigger, f"{best.allocation.label()} has no one-GPU-bigger neighbour in {POOL}"
    return ctx, best, bigger


def test_the_first_trials_are_the_plan_in_force_then_its_neighbours(case):
    ctx, best, bigger = case
    current = bigger[0]
    starts = neighbours(ctx, current)
    assert starts[0] == current and best in starts  # one GPU less, same knobs
    assert all(abs(s.allocation.gpus - current.allocation.gpus) <= 1 for s in starts)
    result = warm_search(ctx, current, trials=20)
    assert [r.config for r in result.records[:len(starts)]] == starts and all(r.seeded for r in result.records[:3])


def test_warm_start_reaches_the_better_plan_in_fewer_evaluations(case):
    ctx, best, bigger = case
    target = ctx.backend.evaluate(best).objective
    cold = evaluations_to_reach(search(ctx, "has", trials=30), target)
    for current in bigger:
        assert ctx.backend.evaluate(current).objective < target  # the plan in force is worse: a re-plan pays
        warm = evaluations_to_reach(warm_search(ctx, current, trials=30), target)
        assert warm is not None and (cold is None or warm < cold), (current.allocation.label(), warm, cold)


def test_the_result_is_never_worse_than_the_plan_in_force(case):
    ctx, best, bigger = case
    req = ctx.request
    for current in [best, *bigger]:
        result = warm_search(ctx, current, trials=12)
        _, _, predicted = warm_pick(ctx, result, current)
        _, summary = ctx.backend.run(current, requests=req.prediction_requests, seed=req.workload_seed + 1)
        mine = summary.goodput_rps * 3600 / current.allocation.cost_per_hour(ctx.catalog)
        assert predicted.objective >= mine * (1 - 1e-9), current.label()
    kept = warm_pick(ctx, warm_search(ctx, best, trials=12), best)  # the better plan in force: kept, or a gain
    assert kept[0].config == best or kept[2].objective > ctx.backend.evaluate(best).objective * 0.99


def test_warm_plan_round_trips_the_plan_in_force(case):
    ctx, best, bigger = case
    first = search(ctx, "has", trials=6, starts=[bigger[0]])
    picked = pick(ctx, first)
    incumbent = make_plan(ctx, first, picked=picked)
    assert plan_config(incumbent) == picked[0].config  # layout and knobs survive the plan file
    plan = warm_plan(ctx, incumbent, trials=12)
    assert plan is incumbent or plan.predicted.objective > incumbent.predicted.objective  # a switch must gain
    best_plan = make_plan(ctx, search(ctx, "has", trials=6, starts=[best]))
    again = warm_plan(ctx, best_plan, trials=12)  # the better plan in force: kept as is, or beaten
    assert again is best_plan or again.predicted.objective > best_plan.predicted.objective
