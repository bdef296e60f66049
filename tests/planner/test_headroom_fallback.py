"""Stage 1's headroom fallback: when no layout keeps the requested headroom (max_utilisation) but some keep up
at all, the planner plans at 100% of capacity and says so in the plan, instead of refusing."""

from __future__ import annotations

import pytest

from coordinator.planner.goodput import SLO
from coordinator.planner.planning import (
    PlanError,
    PlanRequest,
    make_plan,
    prepare,
    search,
)
from coordinator.planner.queueing import stage_loads

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
GPUS = "1xRTX4090,1xA100"


def _request(rate: float) -> PlanRequest:
    return PlanRequest(model="llava-1.5-7b", rate=rate, slo=SLO_, gpus=GPUS, requests_per_trial=30,
                       prediction_requests=60)


@pytest.fixture(scope="module")
def capacity_rps() -> float:
    """The most req/s any layout of the inventory sustains by the queueing model (1 / best score at 1 req/s)."""
    ctx = prepare(_request(0.01))
    return 1.0 / min(stage_loads(a, 1.0, ctx.caps, None).score for a in ctx.allocations)


def test_with_headroom_the_plan_carries_no_reason(capacity_rps):
    ctx = prepare(_request(0.5 * capacity_rps))
    assert ctx.notes == [] and all(c.loads.score < 0.85 for c in ctx.stage1.candidates[:1])


def test_between_the_headroom_and_capacity_it_plans_at_100_percent_and_says_so(capacity_rps):
    rate = 0.93 * capacity_rps  # every layout busier than 85 %, the best still under 100 %
    ctx = prepare(_request(rate))
    assert ctx.stage1.candidates, "stage 1 should keep the layouts that keep up at all"
    assert all(0.85 <= c.loads.score < 1.0 for c in ctx.stage1.candidates)
    assert ctx.feasible and all(stage_loads(a, rate, ctx.caps, None).score < 1.0 for a in ctx.feasible)
    assert len(ctx.notes) == 1 and "planned at 100% of capacity" in ctx.notes[0] and "85%" in ctx.notes[0]
    plan = make_plan(ctx, search(ctx, "has", trials=4))
    assert plan.reasons == ctx.notes
    assert plan.search.stage1 is not None and plan.search.stage1.kept


def test_above_capacity_it_still_refuses_with_what_to_change(capacity_rps):
    with pytest.raises(PlanError, match="even at 100% busy.*lower --rate, add GPUs"):
        prepare(_request(1.05 * capacity_rps))
