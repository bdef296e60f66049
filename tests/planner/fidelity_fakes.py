"""'Live' layout reports made of simulations, for judging the fidelity benchmark offline (sim_fidelity_layouts.judge)."""

from __future__ import annotations

from benchmarks.sim_fidelity import workload
from benchmarks.sim_fidelity_layouts import IMAGE_REQUESTS_BEFORE, LAYOUTS, simulate
from benchmarks.sim_fidelity_speed import STAGES
from benchmarks.sim_fidelity_trace import TRACE_BINS, TRACE_WINDOWS, stage_times
from coordinator.planner.profile import Profile
from coordinator.planner.sim import SimResult
from coordinator.planner.sim_noise import HostTrace


def saved_run(result: SimResult, window_s: float | None = None) -> dict:
    """A simulation's records saved as a live run's; with `window_s` (a result metered in bins of window_s /
    TRACE_BINS) the workers' compute seconds too: each bin's on the two requests whose stage live_windows places
    around the bin's middle (_around), so the run's sums are the simulation's, and per window nearly so."""
    recs = result.records
    saved = {"sent": [r.request.arrival for r in recs], "ttft": [r.ttft for r in recs],
             "e2e": [r.finish - r.request.arrival for r in recs],
             "output_tokens": [r.request.output_tokens for r in recs], "error": [None] * len(recs)}
    if window_s is None:
        return saved
    for stage in STAGES:
        saved[f"{stage}_s"] = [0.0] * len(recs)
    times = [stage_times(saved, i) for i in range(len(recs))]
    for index, stages in result.compute_windows.items():
        middle = (index + 0.5) * window_s / TRACE_BINS
        for stage, seconds in stages.items():
            for i, share in _around(middle, [t[stage] for t in times]):
                saved[f"{stage}_s"][i] += seconds * share
    return saved


def _around(t: float, times: list[float]) -> list[tuple[int, float]]:
    """(request, share): `t` split between the nearest request placed before it and the nearest after, so that their
    shares average to `t` (all on the nearest where `t` lies outside them all)."""
    before = [i for i in range(len(times)) if times[i] <= t]
    after = [i for i in range(len(times)) if times[i] > t]
    if not before or not after:
        return [(min(range(len(times)), key=lambda i: abs(times[i] - t)), 1.0)]
    a, b = max(before, key=lambda i: times[i]), min(after, key=lambda i: times[i])
    late = (t - times[a]) / (times[b] - times[a])
    return [(a, 1.0 - late), (b, late)]


def simulated_report(layout_name: str, profile: Profile, n: int, seed: int, **sim) -> dict:
    """A layout report whose two 'live' runs per rate are the simulation (with the router's line where judge
    continues it: ROUTED_BEFORE); with `record_compute=True` in `sim` the runs carry the workers' compute seconds
    too (saved_run), at an even speed over the run unless `sim` gives a trace."""
    layout = LAYOUTS[layout_name]
    cells = []
    for i, rate in enumerate(layout.rates):
        reqs = workload(rate, profile.encode["image"].tokens_per_item).generate(n, seed=seed)
        window = max(r.arrival for r in reqs) / TRACE_WINDOWS
        even = HostTrace(window, (1.0,) * TRACE_WINDOWS, (1.0,) * TRACE_WINDOWS) if sim.get("record_compute") else None
        result = simulate(layout, profile, reqs, routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i,
                          **({"trace": even} | sim))
        saved = saved_run(result, window if sim.get("record_compute") else None)
        run = {"records": saved, "ttft_stages": {}, "load_average": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]}
        cells.append({"rate": rate, "live_runs": [run, dict(run)], "profile": profile.model_dump(mode="json")})
    return {"layout": layout_name, "about": layout.about, "deployment_simulated": layout.deployment,
            "knobs": layout.knobs, "shared_cores_simulated": [sorted(g) for g in layout.shared_cores],
            "slo": layout.slo.model_dump(), "profiles": [profile.model_dump(mode="json")], "cells": cells}
