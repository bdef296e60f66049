"""Warm-started planning for the re-planner (OServe, issue 16): start the search at the plan in force.

A re-plan usually lands near the plan in force: the load moved a little, so one GPU more or less in one
role, or a slightly different offload share, is the likely answer. A cold HAS search starts from stage 1's
cheapest layouts and may spend most of its budget before it tries that neighbourhood. Here the search's
first trials are the plan in force and its neighbours:

- the current layout with its knobs;
- for each role group, one GPU more (when the pool has one of that tier to spare) and one GPU less (when the
  layout stays complete), knobs carried over (clipped into the new layout's space);
- s +- `s_step` on the current layout, where s is a knob.

A neighbour outside the enumerated allocations (one the pool or the model cannot host) is dropped. The
result is never worse than the plan in force while that plan still keeps up: `warm_pick` re-runs both on
the prediction stream and keeps the plan in force unless the search's pick beats it by more than the
tie tolerance (a switch costs something; a tie is not worth one).
"""

from __future__ import annotations

from coordinator.planner.allocation import Allocation, GpuGroup
from coordinator.planner.deployment import Deployment
from coordinator.planner.planfile import PlanFile
from coordinator.planner.planning import PlanContext, make_plan, pick, search
from coordinator.planner.search import SearchResult, TrialRecord
from coordinator.planner.space import Knobs, TrialConfig, s_is_a_knob
from coordinator.planner.trials import TrialOutcome

S_STEP = 0.1
"""Offload-share step of a neighbour."""


def plan_config(plan: PlanFile) -> TrialConfig:
    """The layout and knobs of a plan file (what the search calls a trial configuration)."""
    p = plan.policy
    split = "none" if p.partition.mode == "none" else (
        "dynamic" if p.partition.mode == "dynamic" else f"static-{p.partition.static_encoder_fraction:g}")
    return TrialConfig(allocation=plan.allocation(), knobs=Knobs(
        batch=p.batch.max_batch if p.batch.name != "pass_through" else 1, s=p.offload.s, split=split,
        stealing=p.stealing.enabled))


def _resized(alloc: Allocation, index: int, delta: int) -> Allocation | None:
    groups = list(alloc.groups)
    g = groups[index]
    count = g.count + delta * g.variant.tp  # a tensor-parallel group grows and shrinks by whole workers
    if count <= 0:
        groups.pop(index)
    else:
        groups[index] = GpuGroup(tier=g.tier, role=g.role, count=count, variant=g.variant)
    try:
        return Allocation(groups=tuple(groups))
    except ValueError:  # a stage left without GPUs
        return None


def neighbours(ctx: PlanContext, current: TrialConfig, s_step: float = S_STEP) -> list[TrialConfig]:
    """The plan in force, then its neighbours (module docstring) that the context's allocations contain."""
    known = {a.label(): a for a in ctx.allocations}
    out = [current]
    alloc = current.allocation
    for i in range(len(alloc.groups)):
        for delta in (-1, 1):
            moved = _resized(alloc, i, delta)
            if moved is not None and moved.label() in known:
                out.append(TrialConfig(allocation=known[moved.label()], knobs=current.knobs))
    if s_is_a_knob(alloc):
        for ds in (-s_step, s_step):
            s = min(1.0, max(0.0, current.knobs.s + ds))
            out.append(TrialConfig(allocation=alloc, knobs=current.knobs.model_copy(update={"s": s})))
    return list(dict.fromkeys(c for c in out if c.allocation.label() in known))


def warm_search(ctx: PlanContext, current: TrialConfig, trials: int = 30, seed: int = 0) -> SearchResult:
    """HAS with the plan in force and its neighbours as its first trials."""
    return search(ctx, "has", trials=trials, seed=seed, starts=neighbours(ctx, current))


def warm_pick(ctx: PlanContext, result: SearchResult, current: TrialConfig,
              tie_tolerance: float = 0.01) -> tuple[TrialRecord, Deployment, TrialOutcome]:
    """pick()'s answer (trial, deployment, outcome on the prediction stream), unless the plan in force does as
    well within `tie_tolerance` on the same stream: then the plan in force."""
    best = pick(ctx, result)
    if best[0].config == current:
        return best
    req = ctx.request
    dep, summary = ctx.backend.run(current, requests=req.prediction_requests, seed=req.workload_seed + 1)
    mine = TrialOutcome.from_summary(summary, current.allocation.cost_per_hour(ctx.catalog), "sim")
    if best[2].objective > mine.objective * (1 + tie_tolerance):
        return best
    record = next((r for r in result.records if r.config == current), None)
    return record or TrialRecord(number=len(result.records), config=current, outcome=mine, seeded=True), dep, mine


def warm_plan(ctx: PlanContext, incumbent: PlanFile, trials: int = 30, seed: int = 0) -> PlanFile:
    """The re-planner's search: a plan for `ctx`, warm-started from `incumbent` and never worse than it on the
    prediction stream; `incumbent` itself (the same object, so the re-planner sees "nothing better") when
    nothing beats it."""
    current = plan_config(incumbent)
    result = warm_search(ctx, current, trials, seed)
    picked = warm_pick(ctx, result, current)
    return incumbent if picked[0].config == current else make_plan(ctx, result, seed, picked=picked)


def evaluations_to_reach(result: SearchResult, target: float, tolerance: float = 0.01) -> int | None:
    """Trials run until the best so far came within `tolerance` of `target` (1-based); None if never."""
    for n, best in enumerate(result.best_so_far(), start=1):
        if best >= target * (1 - tolerance):
            return n
    return None

