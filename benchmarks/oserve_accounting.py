"""benchmarks/oserve.py's accounting: a strategy's serving timeline (plans in force, switches with the old plan
serving and both layouts paid), the day's requests, and per-window goodput per dollar in the simulator."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np

from coordinator.oserve.planner_bridge import PlannerBridge
from coordinator.oserve.traces import Trace
from coordinator.planner.goodput import SLO
from coordinator.planner.planfile import PlanFile
from coordinator.planner.scenarios import default_workload
from coordinator.planner.sim import Simulator
from coordinator.planner.workload import SimRequest


@dataclass(frozen=True)
class Segment:
    """[start, end): `plan` serves every arrival; while switching, `extra_per_hour` more is paid."""

    start: float
    end: float
    plan: PlanFile
    extra_per_hour: float = 0.0


@dataclass
class Run:
    """One strategy's day: its switches (decision time, new plan) and the forecasts it acted on."""

    name: str
    initial: PlanFile
    switches: list[tuple[float, PlanFile]] = field(default_factory=list)
    forecast: list[float] = field(default_factory=list)
    """Forecast total rate at each monitor step (NaN for static)."""


def added_cost(old: PlanFile, new: PlanFile) -> float:
    """$/h of the GPUs `new` starts beside `old` during a switch (roles both plans have keep running)."""
    key = lambda p: Counter((n.tier, n.role, n.dtype, n.tp) for n in p.nodes)
    return sum(new.prices[t] * c for (t, *_), c in (key(new) - key(old)).items())


def segments(run: Run, end: float, window_s: int, switch_s: float) -> list[Segment]:
    """The run's serving timeline, cut at switches' starts and ends and at accounting windows."""
    cuts: list[Segment] = []
    plan, t = run.initial, 0.0
    for at, new in run.switches:
        done = min(end, at + switch_s)
        cuts += [Segment(t, at, plan), Segment(at, done, plan, added_cost(plan, new))]
        plan, t = new, done
    cuts.append(Segment(t, end, plan))
    out = []
    for s in cuts:
        edges = [s.start, *range(int(s.start // window_s + 1) * window_s, math.ceil(s.end), window_s), s.end]
        out += [replace(s, start=a, end=b) for a, b in pairwise(edges) if b > a]
    return out


def day_requests(trace: Trace, model: str, seed: int) -> list[SimRequest]:
    """The trace's arrivals as simulator requests: each second's counts spread uniformly over the second,
    each request's sizes drawn from the model's default workload of its modality."""
    from coordinator.planner.arch import get_arch

    arch, rng = get_arch(model), np.random.default_rng(seed)
    reqs = []
    for modality, counts in trace.counts.items():
        n = int(counts.sum())
        times = np.repeat(np.arange(len(counts)), counts.astype(int)) + rng.random(n)
        sized = default_workload(arch, modality, 1.0).generate(n, rng)
        reqs += [replace(r, arrival=float(t)) for r, t in zip(sized, times)]
    reqs.sort(key=lambda r: r.arrival)
    return [replace(r, request_id=i) for i, r in enumerate(reqs)]


Simulate = Callable[[PlanFile, float, float], tuple[int, int]]
"""(plan, start, end) -> (requests arriving in [start, end), those meeting the SLO) when `plan` serves them."""


def simulator(requests: list[SimRequest], bridge: PlannerBridge, slo: SLO) -> Simulate:
    """Simulate a plan on a stretch of the day's requests, memoised (strategies share many stretches)."""
    arch, perf = bridge.arch, bridge.perf
    arrivals = np.array([r.arrival for r in requests])
    memo: dict[tuple[str, float, float], tuple[int, int]] = {}

    def run(plan: PlanFile, start: float, end: float) -> tuple[int, int]:
        key = (plan.to_yaml(), start, end)
        if key not in memo:
            chunk = requests[int(np.searchsorted(arrivals, start)):int(np.searchsorted(arrivals, end))]
            if not chunk:
                memo[key] = (0, 0)
            else:
                dep = plan.deployment()
                budget = max(dep.engine.max_num_batched_tokens, max(r.prompt_tokens for r in chunk))
                dep = dep.model_copy(update={"engine": dep.engine.model_copy(update={"max_num_batched_tokens": budget})})
                sim = Simulator(dep, perf, kv_bytes_per_token=arch.kv_bytes_per_token(),
                                embedding_bytes_per_token=arch.embedding_bytes(1))
                recs = sim.run(chunk).records
                memo[key] = (len(recs), sum(1 for r in recs if slo.met(r.ttft, r.tpot)))
        return memo[key]

    return run


def account(run: Run, end: float, window_s: int, switch_s: float, simulate: Simulate) -> list[dict]:
    """Per accounting window: requests, good, dollars, goodput per dollar, SLO attainment, plan cost."""
    rows = [{"start_s": w, "requests": 0, "good": 0, "dollars": 0.0, "switching_s": 0.0}
            for w in range(0, math.ceil(end), window_s)]
    for s in segments(run, end, window_s, switch_s):
        row = rows[int(s.start // window_s)]
        n, good = simulate(s.plan, s.start, s.end)
        row["requests"] += n
        row["good"] += good
        row["dollars"] += (s.plan.cost_per_hour() + s.extra_per_hour) * (s.end - s.start) / 3600
        row["switching_s"] += (s.end - s.start) if s.extra_per_hour or _switching(run, s, switch_s) else 0.0
    for row in rows:
        row["good_per_dollar"] = row["good"] / row["dollars"] if row["dollars"] > 0 else 0.0
        row["slo_attainment"] = row["good"] / row["requests"] if row["requests"] else 1.0
    return rows


def _switching(run: Run, s: Segment, switch_s: float) -> bool:
    return any(at <= s.start < at + switch_s for at, _ in run.switches)
