"""The re-planner's two functions over the planner (imported, never changed): utilisation and search.

- `utilisation(plan, forecast)`: HAS stage 1's queueing model (coordinator/planner/queueing.py) over the
  current profiles, per modality: each stage's load at the forecast's whole rate with that modality's
  average request, weighted by the modality's share; the busiest stage's total is the answer.
- `search(forecast, incumbent)`: `tierserve plan`'s search (planning.prepare + search + make_plan) on the
  GPU pool, for the forecast's dominant modality at the rate that loads the incumbent as much as the whole mix
  does (the planner plans one modality), warm-started from the incumbent (planner/warm_start.py: its layout
  and neighbours run first, and the answer is never worse than the incumbent on the prediction stream).
"""

from __future__ import annotations

from functools import lru_cache

from coordinator.oserve.workload_forecast import WorkloadForecast
from coordinator.planner.arch import get_arch
from coordinator.planner.capacity import CapacityConfig, TierCapacity, capacities
from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import SLO
from coordinator.planner.perf import PerfModel
from coordinator.planner.planfile import PlanFile
from coordinator.planner.planning import PlanError, PlanRequest, make_plan, prepare, search
from coordinator.planner.profile import load_profiles
from coordinator.planner.queueing import stage_loads
from coordinator.planner.scenarios import default_workload, mean_shape
from coordinator.planner.warm_start import warm_plan


class PlannerBridge:
    def __init__(self, model: str, pool: str, trials: int = 12, requests_per_trial: int = 60,
                 profile_files: tuple[str, ...] = ()) -> None:
        self.model, self.pool, self.trials = model, pool, trials
        self.requests_per_trial, self.profile_files = requests_per_trial, profile_files
        self.catalog = load_catalog()
        self.arch = get_arch(model)
        self.perf = PerfModel(self.catalog, self.arch, load_profiles(profile_files))
        self.searches = 0

    @lru_cache(maxsize=64)
    def caps(self, modality: str, tiers: tuple[str, ...], tpot_s: float) -> dict[str, TierCapacity]:
        shape = mean_shape(default_workload(self.arch, modality, 1.0), seed=0)
        return capacities(self.perf, self.catalog, self.arch, list(tiers), shape,
                          CapacityConfig(tpot_slo_s=tpot_s, max_decode_batch=32))

    def utilisation(self, plan: PlanFile, fc: WorkloadForecast) -> float:
        alloc = plan.allocation()
        tiers = tuple(sorted({g.key for g in alloc.groups}))
        total = {"e": 0.0, "p": 0.0, "d": 0.0}
        for modality, share in fc.mix.items():
            rate = fc.rate * share
            if rate <= 0 or modality not in self.arch.modalities():
                continue
            # each modality's loads at the whole rate, weighted by its share: stage_loads is not linear in the
            # rate (a local prefill gets the encode time the whole mix leaves idle, not what one modality leaves)
            loads = stage_loads(alloc, fc.rate, self.caps(modality, tiers, plan.slo.tpot_s), None)
            total["e"] += share * loads.rho_e
            total["p"] += share * loads.rho_p
            total["d"] += share * loads.rho_d
        return max(total.values())

    def search(self, fc: WorkloadForecast, incumbent: PlanFile, target: float = 0.6) -> PlanFile | None:
        """A plan for the forecast, or None if the planner finds none (the pool is too small)."""
        found = self.equivalent(fc, incumbent)
        return None if found is None else self.plan_for(found[0], found[1], incumbent.slo, target, incumbent)

    def equivalent(self, fc: WorkloadForecast, incumbent: PlanFile) -> tuple[str, float] | None:
        """(dominant modality, the rate of it alone that loads `incumbent` as much as the whole mix does)."""
        if fc.rate <= 0 or not fc.mix:
            return None
        dominant = max(fc.mix, key=fc.mix.get)
        u_alone = self.utilisation(incumbent, WorkloadForecast(fc.rate, {dominant: 1.0}))
        return dominant, fc.rate * (self.utilisation(incumbent, fc) / u_alone if u_alone > 0 else 1.0)

    def plan_for(self, modality: str, rate: float, slo: SLO, target: float = 0.6,
                 incumbent: PlanFile | None = None) -> PlanFile | None:
        """`tierserve plan`'s answer for `rate` req/s of `modality` on the pool, or None if there is none;
        warm-started from `incumbent` when it serves this modality."""
        self.searches += 1
        try:
            ctx = prepare(PlanRequest(model=self.model, modality=modality, rate=rate, slo=slo, gpus=self.pool,
                                      requests_per_trial=self.requests_per_trial, prediction_requests=200,
                                      max_utilisation=min(0.95, target + 0.25), profile_files=self.profile_files))
            if incumbent is not None and incumbent.modality == modality:
                return warm_plan(ctx, incumbent, trials=self.trials, seed=0)
            return make_plan(ctx, search(ctx, "has", trials=self.trials, seed=0))
        except PlanError:
            return None


def same_layout(a: PlanFile, b: PlanFile) -> bool:
    """Two plans with the same GPUs in the same roles (knobs aside)."""
    key = lambda p: sorted((n.tier, n.role) for n in p.nodes)  # noqa: E731
    return key(a) == key(b)
