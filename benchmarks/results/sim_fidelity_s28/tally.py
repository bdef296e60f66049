"""python benchmarks/results/sim_fidelity_s28/tally.py JUDGED.json... [--json OUT]: per judged record set, the cells
(of 12) with all three figures within 10 % and the figures (of 36) within 10 %, at the profiles' speed, at each run's
mean speed, at its speed over time and at its speed with its host noise (sim_fidelity_noise.py); then every cell's
errors at the run's mean speed and with its noise (goodput, P50 TTFT, mean TPOT, in %), and the noise read per run
([sigma, period s, live spread, live lag-1 autocorrelation])."""
import json
import sys
from pathlib import Path

READINGS = {"profiles": ("within_10pct", "error"), "run_speed": ("within_10pct_run_speed", "error_run_speed"),
            "run_trace": ("within_10pct_run_trace", "error_run_trace"),
            "run_noise": ("within_10pct_run_noise", "error_run_noise")}
args = sys.argv[1:]
out = Path(args.pop(args.index("--json") + 1)) if "--json" in args else None
if out is not None:
    args.remove("--json")
summary = {}
for f in args:
    d = json.loads(Path(f).read_text())
    cells = [c for rep in d["layouts"] for c in rep["cells"]]
    row = {name: {"cells": sum(c.get(flag, False) for c in cells),
                  "figures": sum(e is not None and abs(e) <= 0.10 for c in cells for e in c.get(err, {}).values())}
           for name, (flag, err) in READINGS.items()}
    row["errors_run_speed_pct"] = {rep["layout"]: {f"{c['rate']:g}": [round(100 * e, 1) for e in c["error_run_speed"].values()]
                                                   for c in rep["cells"]} for rep in d["layouts"]}
    row["errors_run_noise_pct"] = {rep["layout"]: {f"{c['rate']:g}": [round(100 * e, 1) for e in c["error_run_noise"].values()]
                                                   for c in rep["cells"] if "error_run_noise" in c} for rep in d["layouts"]}
    row["noise_per_run"] = {rep["layout"]: {f"{c['rate']:g}": [[r["sigma"], r["period_s"], *r["live_step_stats"]]
                                                             for r in c["sim_run_noise"]["runs"]]
                                            for c in rep["cells"] if "sim_run_noise" in c} for rep in d["layouts"]}
    sigmas = sorted(r[0] for cells in row["noise_per_run"].values() for runs in cells.values() for r in runs)
    periods = sorted(r[1] for cells in row["noise_per_run"].values() for runs in cells.values() for r in runs)
    note = (f"  noise read per run: sigma {sigmas[0]:.2f}-{sigmas[-1]:.2f} (median {sigmas[len(sigmas) // 2]:.2f}), "
            f"period median {periods[len(periods) // 2] * 1e3:g} ms") if sigmas else ""
    summary[Path(f).stem] = row
    print(Path(f).stem, {k: f"{v['cells']} cells, {v['figures']} figures" for k, v in row.items() if k in READINGS})
    for layout, errs in row["errors_run_speed_pct"].items():
        noisy = row["errors_run_noise_pct"].get(layout, {})
        print(f"  {layout:<18} " + "  ".join(f"{r}: " + ",".join(f"{e:+.0f}" for e in v)
                                             + (" -> " + ",".join(f"{e:+.0f}" for e in noisy[r]) if r in noisy else "")
                                             for r, v in errs.items()))
    if note:
        print(note)
if out is not None:
    out.write_text(json.dumps(summary, indent=1) + "\n")
