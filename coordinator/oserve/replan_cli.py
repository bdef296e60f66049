"""`tierserve replan`: monitor -> forecast -> re-plan -> switch, against a running cluster.

Every --window-s seconds: read the last window from GET /v1/admin/workload, feed the forecaster, forecast
--horizon-s ahead, ask the re-planner (band, hysteresis, dwell) and, on a switch, PUT the new plan to
/v1/admin/plan. --dry-run prints each decision and why, and changes nothing.
"""

from __future__ import annotations

import argparse
import time

import httpx

from coordinator.oserve.forecast import METHODS, ForecastConfig
from coordinator.oserve.replanner import ReplanConfig, Replanner
from coordinator.oserve.workload_forecast import WorkloadForecaster
from coordinator.planner.planfile import PlanFile, PlanFileError, load_plan


def add_parser(sub) -> None:
    p = sub.add_parser("replan", help="watch a cluster's workload, forecast it, re-plan and switch (or --dry-run)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the coordinator (default: %(default)s)")
    p.add_argument("--plan", metavar="PLAN.yaml", help="the plan in force (default: the one the cluster reports)")
    p.add_argument("--pool", required=True, help="GPUs the re-planner may use, e.g. 4xRTX4090,4xA100")
    p.add_argument("--forecaster", choices=METHODS, default="ewma", help="(default: %(default)s; see "
                   "benchmarks/results/forecast.md)")
    p.add_argument("--window-s", type=int, default=10, help="seconds per monitor window (default: %(default)s)")
    p.add_argument("--horizon-s", type=float, default=30.0, help="seconds ahead to forecast (default: %(default)s)")
    p.add_argument("--dwell-s", type=float, default=300.0, help="least seconds between switches (default: %(default)s)")
    p.add_argument("--band", default="0.35,0.85", help="utilisation band low,high (default: %(default)s)")
    p.add_argument("--sustain", type=int, default=3, help="out-of-band windows before a re-plan (default: %(default)s)")
    p.add_argument("--trials", type=int, default=12, help="search trials per re-plan (default: %(default)s)")
    p.add_argument("--admin-token-file", help="file holding the coordinator's admin token")
    p.add_argument("--windows", type=int, default=0, help="stop after this many windows (default: run until Ctrl-C)")
    p.add_argument("--dry-run", action="store_true", help="print what it would do and why; switch nothing")


def _current_plan(client: httpx.Client, path: str | None) -> PlanFile:
    if path:
        return load_plan(path)
    state = client.get("/v1/admin/plan").raise_for_status().json()
    plan = (state.get("current") or {}).get("plan")
    if not plan:
        raise PlanFileError("the cluster runs no plan file (started without --plan); pass --plan PLAN.yaml")
    return PlanFile.model_validate(plan)


def run(a: argparse.Namespace) -> int:
    from coordinator.oserve.planner_bridge import PlannerBridge, same_layout

    try:
        low, high = (float(x) for x in a.band.split(","))
        config = ReplanConfig(low=low, high=high, sustain_windows=a.sustain, min_dwell_s=a.dwell_s)
    except ValueError as e:
        print(f"error: --band {a.band!r}: {e}")
        return 2
    headers = {}
    if a.admin_token_file:
        headers["Authorization"] = "Bearer " + open(a.admin_token_file).read().strip()
    with httpx.Client(base_url=a.url, headers=headers, timeout=30) as client:
        try:
            plan = _current_plan(client, a.plan)
        except (PlanFileError, httpx.HTTPError) as e:
            print(f"error: {e}")
            return 2
        bridge = PlannerBridge(plan.model, a.pool, trials=a.trials)

        def search(fc, incumbent):
            found = bridge.search(fc, incumbent)
            return None if found is None or same_layout(found, incumbent) else found

        forecaster = WorkloadForecaster(a.forecaster, ForecastConfig(step_s=a.window_s))
        replanner = Replanner(config, plan, bridge.utilisation, search, PlanFile.cost_per_hour, time.monotonic())
        n = 0
        while not a.windows or n < a.windows:
            try:
                time.sleep(a.window_s)
            except KeyboardInterrupt:  # Ctrl-C is how an open-ended run stops
                print("stopped", flush=True)
                return 0
            n += 1
            w = client.get("/v1/admin/workload", params={"window": a.window_s}).raise_for_status().json()
            now = time.monotonic()
            forecaster.observe(now, w["summary"]["modality_rates"])
            fc = forecaster.forecast(now, a.horizon_s)
            d = replanner.step(now, fc)
            print(f"[{time.strftime('%H:%M:%S')}] seen {w['summary']['rate']:.2f} req/s, forecast {fc.rate:.2f} "
                  f"req/s mix {({k: round(v, 2) for k, v in fc.mix.items()})}: {d.action}: {d.reason}", flush=True)
            if d.action == "switch" and not a.dry_run:
                r = client.put("/v1/admin/plan", content=d.plan.to_yaml(), headers={"Content-Type": "application/yaml"})
                print(f"  PUT /v1/admin/plan: {r.status_code} {r.text[:200]}", flush=True)
    return 0
