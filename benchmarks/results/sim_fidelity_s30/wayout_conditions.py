"""When the live way out (client TTFT - the first token's mark) is long: each request's way out, by what else
the cluster was doing as its first token came out: another request finishing at the client within 6 ms before
it or during it ("finish near"), another arriving within 4 ms before or during it ("arrival near"), another
request decoding (its first token out, its last not yet) and neither of those ("decoding only"), or none
("quiet"). Counts and p50 / p90 in ms per cell. Reads a live record set (sim_fidelity --layouts --out).

    python benchmarks/results/sim_fidelity_s30/wayout_conditions.py <live.json> [layout ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np


def conditions(saved: dict) -> list[tuple[float, bool, bool, bool]]:
    n, sent, marks = len(saved["ttft"]), saved["sent"], saved["marks"]
    first = [sent[j] + marks[j].get("first_token", np.nan) for j in range(n)]
    at_client = [sent[j] + saved["e2e"][j] for j in range(n)]
    last = [sent[j] + marks[j].get("finished", np.nan) for j in range(n)]
    rows = []
    for j in range(n):
        if saved["error"][j] or "first_token" not in marks[j]:
            continue
        out = saved["ttft"][j] - marks[j]["first_token"]
        a, b = first[j], first[j] + out
        others = [k for k in range(n) if k != j]
        rows.append((out, any(a - 0.006 < at_client[k] < b for k in others),
                     any(a - 0.004 < sent[k] < b for k in others), any(first[k] < a < last[k] for k in others)))
    return rows


def main(path: str, layouts: list[str]) -> None:
    data = json.load(open(path))
    for report in data["layouts"]:
        if layouts and report["layout"] not in layouts:
            continue
        for cell in report["cells"]:
            rows = [row for run in cell["live_runs"] for row in conditions(run["records"])]
            out = np.array([r[0] for r in rows])
            fin, arr, dec = (np.array([r[i] for r in rows]) for i in (1, 2, 3))

            def stat(mask: np.ndarray) -> str:
                if not mask.sum():
                    return "-"
                return (f"n={mask.sum():3d} p50 {np.percentile(out[mask], 50) * 1e3:4.1f} "
                        f"p90 {np.percentile(out[mask], 90) * 1e3:4.1f}")

            print(f"{report['layout']:18s} {cell['rate']:4g} req/s: finish near {stat(fin)} | arrival near "
                  f"{stat(arr & ~fin)} | decoding only {stat(dec & ~fin & ~arr)} | quiet {stat(~dec & ~fin & ~arr)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
