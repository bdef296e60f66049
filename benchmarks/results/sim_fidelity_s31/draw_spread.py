"""How much one draw of the host noise moves a cell's simulated figures: every run of a judged record set (one judged
on one draw, before NOISE_DRAWS) re-simulated at the speed, sigma and period judge read for it, at SEEDS seeds of the
noise (k, k + 100, ...; judge's draw is k); per cell the errors of judge's single draw, the errors of the mean over the
seeds, and each figure's range over the seeds as a share of the live mean. Analysis only (the readings are not
refitted on the mean: the sim_fidelity --noise-draws judgement does that).

    python benchmarks/results/sim_fidelity_s31/draw_spread.py <judged.json> <seeds>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim_fidelity_s29"))
from handoff_trial import judged_cells  # noqa: E402

from benchmarks.sim_fidelity_layouts import IMAGE_REQUESTS_BEFORE, METRICS, figures, simulate  # noqa: E402
from coordinator.planner.sim_noise import HostNoise  # noqa: E402


def main(path: str, seeds: int) -> None:
    data = json.load(open(path))
    n = data["requests_per_rate"]
    single = mean_ok = 0
    for name, layout, slo, stack, i, cell, profile, reqs in judged_cells(
            data, ["epd", "colocated_prefill", "stealing", "adaptive"]):
        share, cores, loop = stack
        per_seed = []
        for extra in range(seeds):
            figs = []
            for k, read in enumerate(cell["sim_run_noise"]["runs"]):
                speed = tuple(read["speed"][g] for g in ("encode", "prefill", "decode"))
                result = simulate(layout, profile, reqs, share, cores, routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i,
                                  loop_share=loop, speed=speed, record_compute=True,
                                  noise=HostNoise(sigma=read["sigma"], period_s=read["period_s"], seed=k + 100 * extra))
                figs.append(figures(result.summary(slo)))
            per_seed.append({m: np.mean([f[m] for f in figs]) for m in METRICS})
        live = cell["live_mean"]
        err = {m: np.mean([p[m] for p in per_seed]) / live[m] - 1 for m in METRICS}
        rng = {m: (max(p[m] for p in per_seed) - min(p[m] for p in per_seed)) / live[m] for m in METRICS}
        ok1, okm = cell["within_10pct_run_noise"], all(abs(e) <= 0.1 for e in err.values())
        single, mean_ok = single + ok1, mean_ok + okm
        print(f"{name:17s} {cell['rate']:4g} judge " + " ".join(f"{cell['error_run_noise'][m]:+.1%}" for m in METRICS)
              + f"{' ok' if ok1 else '   '} | mean of {seeds} " + " ".join(f"{err[m]:+.1%}" for m in METRICS)
              + f"{' ok' if okm else '   '} | range " + " ".join(f"{rng[m]:.1%}" for m in METRICS), flush=True)
    print(f"cells within 10 %: judge's one draw {single}, mean of {seeds} draws {mean_ok}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]))
