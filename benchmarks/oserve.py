"""OServe in the simulator: a compressed day served by a static plan, by re-planning with each forecaster,
and by an oracle that knows the future; goodput per dollar and SLO attainment per window.

    python -m benchmarks.oserve --seconds 14400 --base 6 --switch-s 95

The day (coordinator/oserve/traces.py, make_trace("day")): a quiet night, an image-heavy morning and a
video-heavy evening peak, as per-second Poisson counts of each modality. Strategies, all starting from the
same plan:
- static: the plan `tierserve plan` makes for the day's average rate and mix, all day;
- replan-<method>: every monitor window the forecaster (coordinator/oserve/forecast.py) sees the window's
  counts and forecasts `--horizon-s` ahead; the Replanner (band, hysteresis, dwell) decides; the search is
  PlannerBridge's (the planner's HAS on the simulator), memoised per modality and rate rounded up to a grid;
- oracle: the same re-planner fed the true mean rates of the window the new plan would start serving in
  (no forecast error, no noise: one out-of-band window suffices).

A switch takes `--switch-s` seconds (default 95: the live switch measured on a loaded CPU machine; OServe
reports ~30 s). During it the old plan serves every arrival and both layouts are paid for (the GPUs the new
plan adds run warming beside the old ones), as the live PlanSwitch does. Accounting: the day is cut into
windows of `--window-s`; within a window each stretch of one serving plan is simulated on the requests
arriving in it (that plan serves them to the end, as a retiring plan drains its in-flight requests); a
window's goodput per dollar is its good requests over the dollars its GPUs cost during it. The simulator is
the planner's (coordinator/planner/sim.py); the timeline and accounting are in oserve_accounting.py, the PNG and
Markdown in oserve_report.py; results go to benchmarks/results/oserve.{json,md,png} (--tag: oserve.<tag>.*).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.oserve_accounting import Run, account, day_requests, segments, simulator
from coordinator.oserve.forecast import METHODS, ForecastConfig
from coordinator.oserve.planner_bridge import PlannerBridge, same_layout
from coordinator.oserve.replanner import ReplanConfig, Replanner
from coordinator.oserve.traces import Trace, make_trace
from coordinator.oserve.workload_forecast import WorkloadForecast, WorkloadForecaster
from coordinator.planner.goodput import SLO
from coordinator.planner.planfile import PlanFile

OUT = Path(__file__).parent / "results"


class BenchConfig(BaseModel):
    """What the benchmark runs (every time in seconds, rates in req/s)."""

    model_config = ConfigDict(frozen=True)

    model: str = "qwen2.5-vl-7b"
    """A model taking images and video (the day shifts between them)."""
    pool: str = "4xRTX4090,4xA100"
    """GPUs the planner may use."""
    slo: SLO = SLO(ttft_s=5.0, tpot_s=0.1)
    seconds: int = Field(14400, ge=60)
    """Length of the compressed day (14400: one hour of the day in 600 s)."""
    base: float = Field(6.0, gt=0)
    """The trace's base rate; the day runs from a quarter of it to about 1.2x."""
    seed: int = 0
    step_s: int = Field(10, ge=1)
    """Monitor window: the forecasters see one count per step."""
    horizon_s: float = Field(95.0, ge=0)
    """How far ahead the forecast looks (default: the switch time, when a plan decided now takes over)."""
    window_s: int = Field(600, ge=1)
    """Accounting window of the per-window goodput per dollar and SLO attainment."""
    switch_s: float = Field(95.0, ge=0)
    """Seconds from the decision to the new plan serving; the old plan serves meanwhile, both are paid."""
    replan: ReplanConfig = ReplanConfig()
    trials: int = Field(8, ge=1)
    """Search trials per plan (the planner's HAS on the simulator)."""
    rate_grid: float = Field(1.15, gt=1)
    """Plans are searched for rates rounded up to powers of this (so a day needs a few dozen searches)."""


class Plans:
    """The re-planner's search, memoised: (dominant modality, equivalent rate rounded up to the grid) -> plan."""

    def __init__(self, bridge: PlannerBridge, grid: float) -> None:
        self.bridge, self.grid = bridge, grid
        self.memo: dict[tuple[str, float], PlanFile | None] = {}

    def rounded(self, rate: float) -> float:
        return round(self.grid ** math.ceil(math.log(max(rate, 0.05), self.grid) - 1e-9), 4)

    def plan_for(self, modality: str, rate: float, slo: SLO) -> PlanFile | None:
        key = (modality, self.rounded(rate))
        if key not in self.memo:
            self.memo[key] = self.bridge.plan_for(modality, key[1], slo)
            print(f"  searched {key}: {self.memo[key] and describe(self.memo[key])}", file=sys.stderr, flush=True)
        return self.memo[key]

    def search(self, fc: WorkloadForecast, incumbent: PlanFile) -> PlanFile | None:
        found = self.bridge.equivalent(fc, incumbent)
        plan = None if found is None else self.plan_for(found[0], found[1], incumbent.slo)
        return None if plan is None or same_layout(plan, incumbent) else plan


def describe(plan: PlanFile) -> str:
    roles = Counter(f"{n.tier}:{n.role}" for n in plan.nodes)
    return " + ".join(f"{c}x{k}" for k, c in sorted(roles.items())) + f" (${plan.cost_per_hour():.2f}/h)"


def true_forecast(trace: Trace, start: float, length: float) -> WorkloadForecast:
    """The trace's true mean rates over [start, start + length): what an oracle knows."""
    a = min(int(start), trace.seconds - 1)
    b = min(max(a + 1, int(start + length)), trace.seconds)
    per = {m: float(v[a:b].mean()) for m, v in trace.mean.items()}
    total = sum(per.values())
    return WorkloadForecast(total, {m: r / total for m, r in per.items()} if total > 0 else {})


def replan_run(name: str, trace: Trace, plans: Plans, initial: PlanFile, cfg: BenchConfig) -> Run:
    """One day of monitor -> forecast -> Replanner decisions; a switch blocks new decisions until it is done."""
    oracle = name == "oracle"
    replan_cfg = cfg.replan.model_copy(update={"sustain_windows": 1}) if oracle else cfg.replan
    forecaster = None if oracle else WorkloadForecaster(name.removeprefix("replan-"), ForecastConfig(step_s=cfg.step_s))
    rp = Replanner(replan_cfg, initial, plans.bridge.utilisation, plans.search, PlanFile.cost_per_hour, 0.0)
    obs = trace.windows(cfg.step_s)
    run, busy_until = Run(name, initial), 0.0
    for i in range(trace.seconds // cfg.step_s):
        now = float((i + 1) * cfg.step_s)
        if oracle:
            fc = true_forecast(trace, now + cfg.horizon_s, cfg.step_s)
        else:
            forecaster.observe(now, {m: float(v[i]) for m, v in obs.items()})
            fc = forecaster.forecast(now, cfg.horizon_s)
        run.forecast.append(fc.rate)
        if now < busy_until or now >= trace.seconds:
            continue
        d = rp.step(now, fc)
        if d.action == "switch":
            run.switches.append((now, d.plan))
            busy_until = now + cfg.switch_s
    return run


def strategies(cfg: BenchConfig, trace: Trace, plans: Plans, methods: tuple[str, ...]) -> tuple[PlanFile, list[Run]]:
    """The static plan (for the day's average rate and mix) and every strategy's run from it."""
    avg = true_forecast(trace, 0, trace.seconds)
    dominant = max(avg.mix, key=avg.mix.get)
    bootstrap = plans.plan_for(dominant, avg.rate, cfg.slo)
    if bootstrap is None:
        raise SystemExit(f"error: the planner finds no plan for {avg.rate:.2f} req/s of {dominant} on {cfg.pool}; "
                         f"lower --base or widen --pool")
    static = plans.search(avg, bootstrap) or bootstrap
    busiest = max(range(0, trace.seconds, cfg.window_s), key=lambda t: true_forecast(trace, t, cfg.window_s).rate)
    peak = plans.search(true_forecast(trace, busiest, cfg.window_s), static) or static
    runs = [Run(name, plan, forecast=[math.nan] * (trace.seconds // cfg.step_s))
            for name, plan in (("static", static), ("static-peak", peak))]
    for name in (*(f"replan-{m}" for m in methods), "oracle"):
        t0 = time.perf_counter()
        runs.append(replan_run(name, trace, plans, static, cfg))
        print(f"{name}: {len(runs[-1].switches)} switches ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    return static, runs


def summarise(run: Run, rows: list[dict], static_rows: list[dict], peak_rows: list[dict]) -> dict:
    """The day's totals of one strategy, against the static plans (x static: the day-average plan's)."""
    good, dollars, n = (sum(r[k] for r in rows) for k in ("good", "dollars", "requests"))
    static_gpd = sum(r["good"] for r in static_rows) / sum(r["dollars"] for r in static_rows)
    peak_gpd = sum(r["good"] for r in peak_rows) / sum(r["dollars"] for r in peak_rows)
    ratios = [r["good_per_dollar"] / s["good_per_dollar"] for r, s in zip(rows, static_rows) if s["good_per_dollar"] > 0]
    return {"strategy": run.name, "good_per_dollar": good / dollars, "over_static": good / dollars / static_gpd,
            "over_static_peak": good / dollars / peak_gpd,
            "slo_attainment": good / n, "dollars": dollars, "good": good, "requests": n, "switches": len(run.switches),
            "switching_s": sum(r["switching_s"] for r in rows), "best_window_over_static": max(ratios, default=0.0),
            "worst_window_over_static": min(ratios, default=0.0),
            "switch_log": [{"at_s": at, "plan": describe(p)} for at, p in run.switches]}


def run_bench(cfg: BenchConfig, methods: tuple[str, ...]) -> dict:
    trace = make_trace("day", cfg.seconds, cfg.base, cfg.seed)
    bridge = PlannerBridge(cfg.model, cfg.pool, trials=cfg.trials)
    plans = Plans(bridge, cfg.rate_grid)
    static, runs = strategies(cfg, trace, plans, methods)
    simulate = simulator(day_requests(trace, cfg.model, cfg.seed), bridge, cfg.slo)
    per_window = {r.name: account(r, trace.seconds, cfg.window_s, cfg.switch_s, simulate) for r in runs}
    summary = [summarise(r, per_window[r.name], per_window["static"], per_window["static-peak"]) for r in runs]
    return {"static_plan": describe(static), "static_peak_plan": describe(runs[1].initial), "searches": bridge.searches, "summary": summary,
            "windows": per_window, "trace": {m: v.tolist() for m, v in trace.windows(cfg.step_s, "mean").items()},
            "observed": {m: v.tolist() for m, v in trace.windows(cfg.step_s).items()},
            "forecast": {r.name: r.forecast for r in runs if not r.name.startswith("static")},
            "cost_per_hour": {r.name: cost_curve(r, cfg, trace.seconds) for r in runs}}


def cost_curve(run: Run, cfg: BenchConfig, end: float) -> list[float]:
    """$/h paid at each monitor step (both layouts during a switch)."""
    segs = segments(run, end, cfg.window_s, cfg.switch_s)
    return [next(s.plan.cost_per_hour() + s.extra_per_hour for s in segs if s.start <= t < s.end)
            for t in np.arange(0, end, cfg.step_s)]


def band(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"--band takes low,high (two utilisations), got {text!r}")
    return float(parts[0]), float(parts[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=14400, help="length of the compressed day, s (default: %(default)s)")
    p.add_argument("--base", type=float, default=6.0, help="the trace's base rate, req/s (default: %(default)s)")
    p.add_argument("--switch-s", type=float, default=95.0, help="seconds a plan switch takes (default: %(default)s, "
                   "measured live on a loaded CPU machine; OServe reports ~30)")
    p.add_argument("--horizon-s", type=float, help="forecast horizon, s (default: the switch time)")
    p.add_argument("--window-s", type=int, default=600, help="accounting window, s (default: %(default)s)")
    p.add_argument("--dwell-s", type=float, default=300.0, help="least seconds between switches (default: %(default)s)")
    p.add_argument("--band", default="0.35,0.85", help="re-planner utilisation band low,high (default: %(default)s)")
    p.add_argument("--methods", default=",".join(METHODS), help="forecasters to re-plan with (default: %(default)s)")
    p.add_argument("--trials", type=int, default=8, help="search trials per plan (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT), help="directory for oserve.json/.md/.png (default: %(default)s)")
    p.add_argument("--tag", default="", help="write oserve.<tag>.{json,md,png} (a variant beside the main result)")
    p.add_argument("--report-only", metavar="OSERVE.json", help="re-write the .md and .png from a saved result")
    a = p.parse_args(argv)
    from benchmarks.oserve_report import markdown, plot

    out, stem = Path(a.out), "oserve" + (f".{a.tag}" if a.tag else "")
    out.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        saved = json.loads(Path(a.report_only).read_text())
        cfg = BenchConfig.model_validate(saved["config"])
        plot(saved, cfg, out / f"{stem}.png")
        (out / f"{stem}.md").write_text(markdown(saved, cfg, saved["command"]))
        return 0
    methods = tuple(m for m in a.methods.split(",") if m)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}; choose from {', '.join(METHODS)}")
    try:
        cfg = BenchConfig(seconds=a.seconds, base=a.base, switch_s=a.switch_s, window_s=a.window_s, seed=a.seed,
                          horizon_s=a.switch_s if a.horizon_s is None else a.horizon_s, trials=a.trials,
                          replan=ReplanConfig(min_dwell_s=a.dwell_s, **dict(zip(("low", "high"), band(a.band)))))
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    result = run_bench(cfg, methods)
    command = "python -m benchmarks.oserve " + " ".join(sys.argv[1:] if argv is None else argv)
    plot(result, cfg, out / f"{stem}.png")
    meta = {"command": command, "config": cfg.model_dump(mode="json"), "wall_s": time.perf_counter() - t0,
            "python": platform.python_version(), "machine": platform.machine()}
    (out / f"{stem}.json").write_text(json.dumps({**meta, **result}, indent=1))
    (out / f"{stem}.md").write_text(markdown(result, cfg, command))
    print(markdown(result, cfg, command).split("\n\nPer window")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
