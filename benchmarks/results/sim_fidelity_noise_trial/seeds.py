"""Tight-SLO errors of epd and colocated_prefill with host noise (sigma 0.25, 50 ms) over five seeds.
Run from the repository root; prints one line per layout and rate."""
import json, subprocess, sys
from pathlib import Path

OUT = Path("/tmp/noise-trial"); OUT.mkdir(exist_ok=True)
for lay, slo in (("epd", "epd=0.045,0.0032"), ("colocated_prefill", "colocated_prefill=0.05,0.0045")):
    rows = []
    for seed in range(5):
        out = OUT / f"seed-{lay}-{seed}.json"
        subprocess.run([sys.executable, "-m", "benchmarks.sim_fidelity", "--resimulate",
                        f"benchmarks/results/sim_fidelity_layouts.at-6e6191d.{lay}.json", "--slo", slo,
                        "--host-noise-sigma", "0.25", "--host-noise-period-ms", "50", "--host-noise-seed", str(seed),
                        "--out", str(out)], check=True, capture_output=True)
        cells = sorted(json.loads(out.read_text())["layouts"][0]["cells"], key=lambda c: c["rate"])
        rows.append([(c["rate"], *(round(100 * c["error"][k], 1) for k in ("goodput_rps", "ttft_p50_s", "tpot_mean_s")))
                     for c in cells])
    for i in range(len(rows[0])):
        g, t, p = ([r[i][j] for r in rows] for j in (1, 2, 3))
        print(f"{lay} {rows[0][i][0]} req/s: goodput err % {g} (mean {sum(g) / len(g):.1f}) | P50 TTFT {t} | TPOT {p}")
