"""A real plan file from a small planning run, for the tests that read, write or launch plans."""

from __future__ import annotations

from coordinator.planner.goodput import SLO
from coordinator.planner.planfile import PlanFile
from coordinator.planner.planning import PlanRequest, make_plan, prepare, search


def small_plan(trials: int = 4, requests: int = 30, prediction: int = 60) -> PlanFile:
    """LLaVA-1.5-7B at 4 req/s on 2xRTX4090 + 2xA100, searched briefly on the simulator."""
    req = PlanRequest(model="llava-1.5-7b", rate=4, slo=SLO(ttft_s=2.0, tpot_s=0.1), gpus="2xRTX4090,2xA100",
                      requests_per_trial=requests, prediction_requests=prediction)
    ctx = prepare(req)
    return make_plan(ctx, search(ctx, "has", trials=trials, seed=0))
