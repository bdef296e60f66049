"""'Live' layout reports made of simulations, for judging the fidelity benchmark offline (sim_fidelity_layouts.judge)."""

from __future__ import annotations

from benchmarks.sim_fidelity import workload
from benchmarks.sim_fidelity_layouts import IMAGE_REQUESTS_BEFORE, LAYOUTS, simulate
from coordinator.planner.profile import Profile


def simulated_report(layout_name: str, profile: Profile, n: int, seed: int, **sim) -> dict:
    """A layout report whose two 'live' runs per rate are the simulation (with the router's line where judge
    continues it: ROUTED_BEFORE); with `record_compute=True` in `sim` the runs carry the workers' compute seconds
    too (each stage's total on the first request: judging reads sums)."""
    layout = LAYOUTS[layout_name]
    cells = []
    for i, rate in enumerate(layout.rates):
        reqs = workload(rate, profile.encode["image"].tokens_per_item).generate(n, seed=seed)
        result = simulate(layout, profile, reqs, routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i, **sim)
        recs = result.records
        saved = {"sent": [r.request.arrival for r in recs], "ttft": [r.ttft for r in recs],
                 "e2e": [r.finish - r.request.arrival for r in recs],
                 "output_tokens": [r.request.output_tokens for r in recs], "error": [None] * len(recs)}
        for stage, total in result.compute_s.items():
            saved[f"{stage}_s"] = [total] + [0.0] * (len(recs) - 1)
        run = {"records": saved, "ttft_stages": {}, "load_average": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]}
        cells.append({"rate": rate, "live_runs": [run, dict(run)], "profile": profile.model_dump(mode="json")})
    return {"layout": layout_name, "about": layout.about, "deployment_simulated": layout.deployment,
            "knobs": layout.knobs, "shared_cores_simulated": [sorted(g) for g in layout.shared_cores],
            "slo": layout.slo.model_dump(), "profiles": [profile.model_dump(mode="json")], "cells": cells}
