"""Trial of what the way out's tail is worth: re-simulate each cell at its runs' speed and host noise (as
sim_fidelity_layouts.judge reads them) and replace the simulated way out of each request's first and last token
(worker -> coordinator -> client) with seeded draws from the live run's own way outs (client TTFT - the first
token's mark); on the layouts with a P -> D hand-off also with the live KV hand-offs drawn (handoff_trial.py of
session 29), and both. Goodput, P50 TTFT and mean TPOT errors against the live means; "ok": all three within
10 %. Analysis only: it takes its distributions from the runs it is judged against (an upper bound of what a
model of the tail could buy, not a model), and it replaces one method of this process's simulator.

    python benchmarks/results/sim_fidelity_s30/wayout_trial.py <judged.json> [layout ...]
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

from benchmarks.sim_fidelity_layouts import LAYOUTS, METRICS

_spec = importlib.util.spec_from_file_location(
    "handoff_trial", Path(__file__).parent.parent / "sim_fidelity_s29" / "handoff_trial.py")
handoff_trial = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(handoff_trial)


def live_way_outs(saved: dict) -> list[float]:
    return [t - m["first_token"] for t, m, e in zip(saved["ttft"], saved["marks"], saved["error"])
            if not e and "first_token" in m]


def with_way_outs(records, live: list[float], seed: int) -> None:
    """Each record's first and last token's way out replaced by draws from `live` (in place)."""
    rng = random.Random(seed)
    for r in records:
        if r.first_token == r.first_token:  # not NaN: the request got a first token
            produced = r.first_token - r.to_client
            r.finish = r.finish - r.to_client + rng.choice(live)
            r.first_token = produced + rng.choice(live)
            r.to_client = r.first_token - produced


def main(path: str, layouts: list[str]) -> None:
    handoff_trial._use_live_hand_offs()
    data = json.load(open(path))
    n = data["requests_per_rate"]
    tally: dict[str, list[int]] = {}
    for name, layout, slo, stack, i, cell, profile, reqs in handoff_trial.judged_cells(data, layouts or list(LAYOUTS)):
        ways = ("model", "way out") + (("hand-off", "both") if "decode" in layout.llm_roles else ())
        line = [f"{name:18s} {cell['rate']:4g} req/s  judge " +
                " ".join(f"{cell['error_run_noise'][m]:+.0%}" for m in METRICS)]
        for way in ways:
            figs = []
            for k, (run, read) in enumerate(zip(cell["live_runs"], cell["sim_run_noise"]["runs"])):
                handoff_trial.HAND_OFF["of"] = (
                    handoff_trial.live_hand_offs(run["records"], [r.request_id for r in reqs], "drawn", k)
                    if way in ("hand-off", "both") else None)
                result = handoff_trial.simulate_run(layout, profile, reqs, stack, i, n, read, k)
                if way in ("way out", "both"):
                    with_way_outs(result.records, live_way_outs(run["records"]), 100 + k)
                s = result.summary(slo)
                figs.append({m: getattr(s, m) for m in METRICS})
            errs = [sum(f[m] for f in figs) / len(figs) / cell["live_mean"][m] - 1 for m in METRICS]
            ok = all(abs(e) <= 0.1 for e in errs)
            tally.setdefault(way, [0, 0])
            tally[way][0] += ok
            tally[way][1] += 1
            line.append(f"{way} " + " ".join(f"{e:+.0%}" for e in errs) + (" ok" if ok else ""))
        print("  |  ".join(line), flush=True)
    print("# cells within 10 % on all three:", ", ".join(f"{k} {a} of {b}" for k, (a, b) in tally.items()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
