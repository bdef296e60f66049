"""Forecaster errors on synthetic traces (constant, ramp, diurnal, burst, mix shift): does ARIMA beat last value?

    python -m benchmarks.oserve_forecast --seconds 1800 --seeds 3

Each trace is Poisson arrivals around a known mean curve; every method (coordinator/oserve/forecast.py)
forecasts the total rate and the modality mix 1 and 3 windows ahead, rolling origin, scored against the
observed rate of that window and against the true mean. Writes benchmarks/results/forecast.json (with the
command) and forecast.md (the table and the verdict, ARIMA vs last value, per trace).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

from coordinator.oserve.evaluate import score
from coordinator.oserve.forecast import METHODS, ForecastConfig
from coordinator.oserve.traces import SHAPES, make_trace

OUT = Path(__file__).parent / "results"


def run(seconds: int, seeds: int, step_s: int, horizons: list[int], base: float) -> dict:
    cfg = ForecastConfig(step_s=step_s)
    rows = []
    for shape in SHAPES:
        for horizon in horizons:
            per_method: dict[str, list] = {m: [] for m in METHODS}
            for seed in range(seeds):
                trace = make_trace(shape, seconds, base, seed)
                for m in METHODS:
                    per_method[m].append(score(trace, m, cfg, horizon))
                print(f"{shape} h={horizon} seed={seed} done", file=sys.stderr, flush=True)
            for m, scores in per_method.items():
                rows.append({"trace": shape, "horizon_windows": horizon, "method": m, "seeds": seeds,
                             "windows": sum(s.windows for s in scores),
                             **{k: float(np.mean([getattr(s, k) for s in scores]))
                                for k in ("mae", "mae_truth", "mape", "mix_mae", "ms_per_forecast")}})
    return {"rows": rows, "verdicts": verdicts(rows)}


def verdicts(rows: list[dict]) -> list[dict]:
    """Per trace and horizon: ARIMA's error over last value's (observed and true), and the best method."""
    out = []
    for shape in SHAPES:
        for h in sorted({r["horizon_windows"] for r in rows}):
            group = {r["method"]: r for r in rows if r["trace"] == shape and r["horizon_windows"] == h}
            if not group:
                continue
            out.append({"trace": shape, "horizon_windows": h,
                        "arima_over_last_mae": group["arima"]["mae"] / group["last"]["mae"],
                        "arima_over_last_mae_truth": group["arima"]["mae_truth"] / group["last"]["mae_truth"],
                        "best_mae": min(group, key=lambda m: group[m]["mae"]),
                        "best_mae_truth": min(group, key=lambda m: group[m]["mae_truth"])})
    return out


def markdown(report: dict) -> str:
    lines = [f"# Forecasters on synthetic traces\n", f"`{report['command']}`\n",
             f"{report['seconds']} s traces around {report['base_rate']} req/s (Poisson counts), windows of "
             f"{report['step_s']} s, {report['seeds']} seeds; errors in req/s. `mae`: against the observed rate "
             "of the target window (what the monitor counts, noise included); `mae_truth`: against the true "
             "mean rate; `mix_mae`: error of the first modality's share.\n",
             "| trace | h | method | mae | mae_truth | mape | mix_mae | ms/forecast |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        lines.append(f"| {r['trace']} | {r['horizon_windows']} | {r['method']} | {r['mae']:.3f} | {r['mae_truth']:.3f} "
                     f"| {r['mape']:.3f} | {r['mix_mae']:.3f} | {r['ms_per_forecast']:.2f} |")
    lines += ["\n## ARIMA vs last value\n", "| trace | h | ARIMA/last (observed) | ARIMA/last (truth) | best (observed) "
              "| best (truth) |", "| --- | --- | --- | --- | --- | --- |"]
    for v in report["verdicts"]:
        lines.append(f"| {v['trace']} | {v['horizon_windows']} | {v['arima_over_last_mae']:.2f} | "
                     f"{v['arima_over_last_mae_truth']:.2f} | {v['best_mae']} | {v['best_mae_truth']} |")
    ratios = [v["arima_over_last_mae"] for v in report["verdicts"]]
    lines.append(f"\nARIMA's error against the observed rate is {min(ratios):.2f}x to {max(ratios):.2f}x last "
                 f"value's (below 1: ARIMA better). {report['note']}\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=1800, help="trace length in seconds (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="traces per shape (default: %(default)s)")
    p.add_argument("--step-s", type=int, default=10, help="window length in seconds (default: %(default)s)")
    p.add_argument("--horizons", default="1,3", help="windows ahead, comma list (default: %(default)s)")
    p.add_argument("--base-rate", type=float, default=5.0, help="mean arrivals per second (default: %(default)s)")
    p.add_argument("--out", default=str(OUT / "forecast"), help="output path without extension")
    a = p.parse_args(argv)
    if a.seconds < 20 * a.step_s:
        p.error(f"--seconds {a.seconds} gives fewer than 20 windows of {a.step_s} s; raise it")
    result = run(a.seconds, a.seeds, a.step_s, [int(h) for h in a.horizons.split(",")], a.base_rate)
    report = {"command": "python -m benchmarks.oserve_forecast " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": platform.platform(), "seconds": a.seconds, "seeds": a.seeds, "step_s": a.step_s,
              "base_rate": a.base_rate, **result,
              "note": "Poisson noise dominates a 10 s window at 5 req/s (sd ~0.7 req/s), so every method's "
                      "observed-rate error is close to the noise floor; the truth column shows which one "
                      "tracks the structure."}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(json.dumps(report, indent=1))
    Path(a.out + ".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
