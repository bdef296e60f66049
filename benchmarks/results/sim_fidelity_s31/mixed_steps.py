"""What a prefill costs live when it shares its engine step with running decodes: the combined-worker layouts' live
requests whose prefill step held no other prefill (no other first token within 0.2 ms of theirs), their step's
compute as the worker's timer reports it (prefill_s: the prefill's and the step's decodes' forwards), grouped by how
many other requests were decoding at their first-token mark (first token out, last not yet). Median ms (count) per
run. Reads a live record set (sim_fidelity --layouts --out).

    python benchmarks/results/sim_fidelity_s31/mixed_steps.py <live.json>...
"""

from __future__ import annotations

import json
import sys

import numpy as np

LAYOUTS = ("colocated_prefill", "stealing", "adaptive")
SAME_STEP_S = 2e-4


def decoding_at(first: list[float], last: list[float], j: int) -> int:
    t = first[j]
    return sum(1 for m in range(len(first)) if m != j and first[m] < t - SAME_STEP_S and last[m] > t)


def main(paths: list[str]) -> None:
    for path in paths:
        data = json.load(open(path))
        n = data["requests_per_rate"]
        for report in data["layouts"]:
            if report["layout"] not in LAYOUTS:
                continue
            for cell in report["cells"]:
                for k, run in enumerate(cell["live_runs"]):
                    s = run["records"]
                    first = [s["sent"][j] + s["marks"][j].get("first_token", np.nan) for j in range(n)]
                    last = [s["sent"][j] + s["marks"][j].get("finished", np.nan) for j in range(n)]
                    ok = [j for j in range(n) if not s["error"][j] and "first_token" in s["marks"][j] and s["prefill_s"][j]]
                    alone = [j for j in ok if not any(m != j and abs(first[m] - first[j]) < SAME_STEP_S for m in ok)]
                    rows = np.array([(decoding_at(first, last, j), s["prefill_s"][j]) for j in alone])
                    out = [f"{b}: {np.median(rows[rows[:, 0] == b, 1]) * 1e3:5.2f} ({(rows[:, 0] == b).sum():3d})"
                           for b in range(4) if (rows[:, 0] == b).sum() >= 4]
                    print(f"{path.split('/')[-1]:16s} {report['layout']:17s} {cell['rate']:4g} req/s run {k + 1}: "
                          + "  ".join(out))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
