"""`tierserve plan` end to end: a planning problem -> stage 1 -> a search -> a plan file.

    ctx = prepare(PlanRequest(model="llava-1.5-7b", rate=5, slo=SLO(ttft_s=2, tpot_s=0.1), gpus="2xRTX4090,2xA100"))
    result = search(ctx, "has", trials=30)
    plan = make_plan(ctx, result)

`prepare` does everything that needs no trial: the catalog, the model, the workload and its average
request, the allocations (within a budget or an inventory), each tier's capacities and HAS stage 1.
Stage 1 ranks by price here (Stage1Config.rank_by="price"): at a fixed planned rate every layout that
keeps up delivers the same goodput, so the cheapest with headroom wins; `max_utilisation` is that
headroom; when no layout keeps it but some keep up at all (every stage under 100 % busy), the planner plans
among those and says so in the plan's reasons rather than refusing. Every user mistake surfaces as a
PlanError whose message says what to change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from coordinator.planner.allocation import (
    Allocation,
    CanHost,
    enumerate_budget,
    enumerate_inventory,
    parse_inventory,
)
from coordinator.planner.allocation_variants import expand, hosts_some_variant
from coordinator.planner.arch import ModelArch, get_arch
from coordinator.planner.capacity import (
    CapacityConfig,
    RequestShape,
    TierCapacity,
    capacities,
    host_check,
)
from coordinator.planner.catalog import Catalog, CatalogError, load_catalog
from coordinator.planner.deployment import Deployment
from coordinator.planner.has import HasConfig, stage2
from coordinator.planner.perf import PerfModel
from coordinator.planner.plan_request import PlanError, PlanRequest
from coordinator.planner.planfile import PlanFile, SearchInfo, Stage1Info, plan_nodes
from coordinator.planner.profile import load_profiles
from coordinator.planner.queueing import (
    Candidate,
    Stage1Config,
    Stage1Result,
    b_max,
    stage1,
    stage_loads,
)
from coordinator.planner.scenarios import default_workload, mean_shape
from coordinator.planner.search import (
    OnTrial,
    SearchResult,
    TrialRecord,
    coordinate_search,
    random_search,
)
from coordinator.planner.space import (
    KnobSpace,
    TrialConfig,
    can_steal,
    full_space,
    s_is_a_knob,
)
from coordinator.planner.stopping import StoppingConfig
from coordinator.planner.trials import (
    SimBackend,
    SimSettings,
    TrialBackend,
    TrialOutcome,
)
from coordinator.planner.validation import validated_best
from coordinator.planner.workload import Workload

Method = Literal["has", "random", "coordinate"]


@dataclass
class PlanContext:
    """Everything `prepare` worked out; searches and the plan file read it."""

    request: PlanRequest
    catalog: Catalog
    arch: ModelArch
    perf: PerfModel
    workload: Workload
    shape: RequestShape
    can_host: CanHost
    allocations: list[Allocation]
    caps: dict[str, TierCapacity]
    stage1: Stage1Result
    feasible: list[Allocation]
    """Allocations under the utilisation ceiling: what the baselines search."""
    backend: SimBackend
    notes: list[str]
    """Why the plan departs from the request's settings (planned at 100% of capacity); copied to the plan."""


def _allocations(req: PlanRequest, catalog: Catalog, can_host: CanHost) -> list[Allocation]:
    """The role layouts of the inventory or budget, each in the deployment variants that fit."""
    return expand(_layouts(req, catalog, hosts_some_variant(can_host, req.variants)), req.variants, can_host)


def _layouts(req: PlanRequest, catalog: Catalog, can_host: CanHost) -> list[Allocation]:
    if req.gpus is not None:
        inventory = parse_inventory(req.gpus, catalog)
        found = enumerate_inventory(inventory, can_host)
        if not found:
            raise PlanError(f"no complete allocation of {req.gpus} can serve {req.model}: every request needs an "
                            f"encode GPU and a GPU whose memory holds the LLM; add a larger GPU")
        return found
    tiers = list(req.tiers) if req.tiers else None
    found = enumerate_budget(catalog, req.budget_per_hour, tiers, req.max_gpus, can_host)
    if not found:
        names = [catalog.resolve(t) for t in tiers] if tiers else catalog.names("gpu")
        enc = min((catalog.tier(t).price_per_hour for t in names if can_host(t, "E")), default=math.inf)
        llm = min((catalog.tier(t).price_per_hour for t in names if can_host(t, "P+D")), default=math.inf)
        cheapest = ("none of the tiers holds the LLM" if math.isinf(enc + llm)
                    else f"the cheapest costs ${enc + llm:.2f}/h")
        raise PlanError(f"a budget of ${req.budget_per_hour:g}/h buys no complete allocation for {req.model} "
                        f"(an encode GPU plus a GPU holding the LLM; {cheapest}); raise --budget")
    return found


def prepare(req: PlanRequest) -> PlanContext:
    """Stage 1 and everything before it; raises PlanError on any problem with the request."""
    try:
        catalog = load_catalog(*req.catalog_files)
        arch = get_arch(req.model)
        modality = req.modality or arch.modalities()[0]
        workload = default_workload(arch, modality, req.rate)
        shape = mean_shape(workload, seed=req.workload_seed)
        can_host = host_check(catalog, arch, shape)
        allocations = _allocations(req, catalog, can_host)
    except (CatalogError, KeyError, ValueError, ValidationError) as exc:
        if isinstance(exc, PlanError):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise PlanError(message.replace("load_catalog(path)", "--catalog FILE")) from None
    for tier in sorted({g.tier for a in allocations for g in a.groups}):
        if catalog.tier(tier).price_per_hour <= 0:
            raise PlanError(f"tier {tier} costs $0/h, so goodput per dollar is unbounded; give it a price in a "
                            f"user catalog file (--catalog)")
    try:
        perf = PerfModel(catalog, arch, load_profiles(req.profile_files))
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise PlanError(f"--profile: {message}") from None
    tiers = sorted({g.key for a in allocations for g in a.groups})
    caps = capacities(perf, catalog, arch, tiers, shape,
                      CapacityConfig(tpot_slo_s=req.slo.tpot_s, max_decode_batch=req.max_num_seqs))
    cfg = Stage1Config(rank_by="price", max_score=req.max_utilisation, alpha=None)
    tight = stage1(allocations, req.rate, caps, catalog, cfg.model_copy(update={"max_score": 1.0}))
    kept, notes = stage1(allocations, req.rate, caps, catalog, cfg), []
    if not kept.candidates and tight.candidates:
        kept, cfg = tight, cfg.model_copy(update={"max_score": 1.0})
        notes.append(f"planned at 100% of capacity: no layout keeps every stage under {req.max_utilisation:.0%} "
                     f"busy at {req.rate:g} req/s (the latency headroom), so stage 1 kept the cheapest that keep "
                     f"up at all; expect queueing near the SLO")
    result = _with_tight_candidates(kept, tight)
    feasible = [a for a in allocations if stage_loads(a, req.rate, caps, cfg.alpha).score < cfg.max_score]
    if not result.candidates:
        best = min(allocations, key=lambda a: stage_loads(a, req.rate, caps, cfg.alpha).score)
        loads = stage_loads(best, req.rate, caps, cfg.alpha)
        raise PlanError(f"no allocation keeps up with {req.rate:g} req/s even at 100% busy: the least loaded, "
                        f"{best.label()}, has rho_E={loads.rho_e:.2f} rho_P={loads.rho_p:.2f} "
                        f"rho_D={loads.rho_d:.2f}; lower --rate, add GPUs or raise --budget")
    backend = SimBackend(catalog, arch, perf, workload, req.slo, shape, SimSettings(
        requests=req.requests_per_trial, workload_seed=req.workload_seed, host=req.host, max_num_seqs=req.max_num_seqs))
    return PlanContext(req, catalog, arch, perf, workload, shape, can_host, allocations, caps, result, feasible,
                       backend, notes)


def _with_tight_candidates(kept: Stage1Result, tight: Stage1Result) -> Stage1Result:
    """Stage 1's survivors plus the cheapest layouts the queueing model says keep up at all (every stage
    under 100 % busy; up to stage 1's top K) that are cheaper than every survivor: the headroom
    (max_utilisation) is a guess about latency, which the simulator measures, and the planner suite found
    the cheapest layouts just above it (a $1/h pair of RTX 4090s serving LLaVA-1.5-7B at 5 req/s within
    the SLO, rho_D = 0.852). Several, not one: at one price the least loaded by the model is not always
    the best in the simulator (Qwen2.5-VL video at 10.9 req/s: 1xE+3xP+D beats the 2xE+P layout the
    model ranks first, both $2/h)."""
    if not kept.candidates:
        return kept
    cheapest = min(c.cost_per_hour for c in kept.candidates)
    labels = {c.allocation.label() for c in kept.candidates}
    extra = [c for c in tight.candidates if c.cost_per_hour < cheapest and c.allocation.label() not in labels]
    return kept.model_copy(update={"candidates": (*kept.candidates, *extra)}) if extra else kept


def s_seed(candidate: Candidate, rule: Literal["balanced", "as_stated"],
           half_width: float = 0.2) -> tuple[tuple[float, float], float]:
    """(window, centre) of s for a stage-1 survivor; see PlanRequest.s_star."""
    if rule == "as_stated":
        return candidate.s_range, candidate.s_star
    local, remote = candidate.loads.c_local, candidate.loads.c_remote
    star = local / (local + remote) if local + remote > 0 else 0.0
    return (max(0.0, star - half_width), min(1.0, star + half_width)), star


def has_spaces(ctx: PlanContext) -> list[KnobSpace]:
    """The survivors of stage 1 with their seeded ranges."""
    spaces = []
    for c in ctx.stage1.candidates:
        window, star = s_seed(c, ctx.request.s_star) if s_is_a_knob(c.allocation) else (None, None)
        spaces.append(KnobSpace(allocation=c.allocation, b_max=c.b_max, s_range=window, s_star=star,
                                can_steal=can_steal(c.allocation, ctx.can_host)))
    return spaces


def baseline_spaces(ctx: PlanContext) -> list[KnobSpace]:
    """Every feasible allocation, unpruned ranges (B up to ceil(Lambda), s in [0, 1])."""
    cap = b_max(ctx.request.rate, 1)
    return [full_space(a, cap, ctx.can_host) for a in ctx.feasible]


def search(ctx: PlanContext, method: Method = "has", trials: int = 30, seed: int = 0, storage: str | None = None,
           study_name: str | None = None, on_trial: OnTrial | None = None, stopping: StoppingConfig | None = None,
           backend: TrialBackend | None = None, only: Allocation | None = None,
           starts: Sequence[TrialConfig] = ()) -> SearchResult:
    """Run one searcher with `trials` trials on `backend` (default: the simulator); `only`: search the knobs
    of that allocation alone (a live cluster, whose layout the admin endpoint cannot change); `starts` (HAS
    only): configurations run first, each layout searched too even if stage 1 dropped it (a warm start,
    warm_start.py)."""
    backend = backend or ctx.backend
    if method == "has":
        name = study_name or f"plan-{ctx.request.digest()}-seed{seed}" + (f"-{only.label()}" if only else "")
        cfg = HasConfig(trials=trials, seed=seed, storage=storage, study_name=name, pass_through_seeds=True,
                        stopping=stopping or StoppingConfig())
        return stage2(_with_starts(_only(has_spaces(ctx), only, ctx), starts, ctx), backend, cfg, on_trial, starts)
    if starts:
        raise PlanError(f"warm starts are for HAS; the {method} baseline starts where its seed puts it")
    if storage is not None:
        raise PlanError(f"--storage resumes HAS studies only; the {method} baseline keeps no study")
    searcher = random_search if method == "random" else coordinate_search
    return searcher(_only(baseline_spaces(ctx), only, ctx), backend, trials, seed, on_trial)


def _with_starts(spaces: list[KnobSpace], starts: Sequence[TrialConfig], ctx: PlanContext) -> list[KnobSpace]:
    """`spaces` plus an unpruned space for each start's layout that stage 1 did not keep."""
    have = {s.allocation.label() for s in spaces}
    for start in starts:
        if start.allocation.label() not in have:
            have.add(start.allocation.label())
            spaces = [*spaces, _only([], start.allocation, ctx)[0]]
    return spaces


def _only(spaces: list[KnobSpace], only: Allocation | None, ctx: PlanContext) -> list[KnobSpace]:
    """The spaces of `only` (its seeded space if stage 1 kept it, else the unpruned one); all without it."""
    if only is None:
        return spaces
    kept = [s for s in spaces if s.allocation == only]
    n_encode = sum(g.count for g in only.groups if g.role in ("E", "E+P"))
    return kept or [full_space(only, b_max(ctx.request.rate, max(1, n_encode)), ctx.can_host)]


def service_time_source(perf: PerfModel, tier: str) -> str:
    """Where the performance model takes a tier's service times from, in words for the plan file."""
    profile = perf.profiles.get(perf.catalog.resolve(tier))
    return "roofline" if profile is None else f"measured: {profile.source or profile.measured_at}"


def pick(ctx: PlanContext, result: SearchResult, top: int = 3) -> tuple[TrialRecord, Deployment, TrialOutcome]:
    """The plan's trial, its deployment and its prediction: the search's `top` finalists re-run on the
    prediction stream (`prediction_requests` unseen requests), the best kept (validation.py)."""
    req = ctx.request
    return validated_best(result, lambda c: ctx.backend.run(c, requests=req.prediction_requests,
                                                            seed=req.workload_seed + 1),
                          lambda c: c.allocation.cost_per_hour(ctx.catalog), top)


def make_plan(ctx: PlanContext, result: SearchResult, seed: int = 0, storage: str | None = None,
              picked: tuple[TrialRecord, Deployment, TrialOutcome] | None = None) -> PlanFile:
    """The winner as a plan file, its prediction re-simulated on `prediction_requests` unseen requests;
    `picked`: a winner chosen otherwise (warm_start.warm_pick), with its deployment and prediction."""
    req = ctx.request
    best, dep, predicted = picked or pick(ctx, result)
    nodes = plan_nodes(dep, req.host)
    prices = {t: ctx.catalog.tier(t).price_per_hour for t in sorted({n.tier for n in nodes})}
    stage1_info = Stage1Info(considered=ctx.stage1.considered, feasible=ctx.stage1.feasible,
                             kept=[c.allocation.label() for c in ctx.stage1.candidates])
    info = SearchInfo(method=result.method, backend=best.outcome.backend, trials=len(result.records),
                      budget=result.budget, stop_reason=result.stop_reason, seed=seed, storage=storage,
                      requests_per_trial=req.requests_per_trial, best_trial=best.number,
                      best_trial_objective=best.outcome.objective,
                      stage1=stage1_info if result.method == "has" else None,
                      service_times={t: service_time_source(ctx.perf, t) for t in prices})
    return PlanFile(model=ctx.arch.name, modality=ctx.shape.modality, nodes=nodes, policy=best.config.knobs.policy(),
                    engine=dep.engine, slo=req.slo, workload=ctx.workload, prices=prices, predicted=predicted,
                    search=info, simulated_only=best.config.allocation.simulated_only(),
                    reasons=list(ctx.notes))
