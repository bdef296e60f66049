"""python benchmarks/results/sim_fidelity_s27/tally.py JUDGED.json... [--json OUT]: per judged record set, the cells
(of 12) with all three figures within 10 % and the figures (of 36) within 10 %, at the profiles' speed, at each run's
mean speed and at its speed over time; then every cell's errors at the run's mean speed (goodput, P50 TTFT, mean
TPOT, in %)."""
import json
import sys
from pathlib import Path

READINGS = {"profiles": ("within_10pct", "error"), "run_speed": ("within_10pct_run_speed", "error_run_speed"),
            "run_trace": ("within_10pct_run_trace", "error_run_trace")}
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
    summary[Path(f).stem] = row
    print(Path(f).stem, {k: f"{v['cells']} cells, {v['figures']} figures" for k, v in row.items() if k in READINGS})
    for layout, errs in row["errors_run_speed_pct"].items():
        print(f"  {layout:<18} " + "  ".join(f"{r}: " + ",".join(f"{e:+.0f}" for e in v) for r, v in errs.items()))
if out is not None:
    out.write_text(json.dumps(summary, indent=1) + "\n")
