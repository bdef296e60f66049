"""Where a cell's simulated TTFT parts from live, request by request: the live runs replay the workload the
simulation runs (same seed, same arrivals), so each request's simulated TTFT (at its run's speed and host noise,
as sim_fidelity_layouts.judge reads them) is set against its own live one, grouped by how many other requests
were decoding (first token out, last not yet, by the live marks) as it reached the encoder (5 ms after it was
sent). Prints per group the count, the paired sim - live TTFT (p50, mean) and both p50s, in ms.

    python benchmarks/results/sim_fidelity_s30/paired_ttft.py <judged.json> <layout> <rate req/s>
"""

from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks.sim_fidelity_layouts import (IMAGE_REQUESTS_BEFORE, LAYOUTS, Profile, coordinator_share,
                                             hop_in_share, simulate, stack_shares, workload)
from coordinator.planner.sim_noise import HostNoise


def decoding_at_arrival(saved: dict, n: int) -> list[int]:
    sent, marks = saved["sent"], saved["marks"]
    first = [sent[j] + marks[j].get("first_token", np.nan) for j in range(n)]
    last = [sent[j] + marks[j].get("finished", np.nan) for j in range(n)]
    return [sum(1 for m in range(n) if m != j and first[m] < sent[j] + 0.005 < last[m]) for j in range(n)]


def main(path: str, name: str, rate: float) -> None:
    data = json.load(open(path))
    n = data["requests_per_rate"]
    report = next(r for r in data["layouts"] if r["layout"] == name)
    layout = LAYOUTS[name]
    share, cores, loop = hop_in_share(report), stack_shares(report, layout), coordinator_share(report)
    i, cell = next((i, c) for i, c in enumerate(report["cells"]) if c["rate"] == rate)
    profile = Profile.model_validate(cell["profile"])
    reqs = workload(rate, profile.encode["image"].tokens_per_item).generate(n, seed=data["seed"])
    for k, (run, read) in enumerate(zip(cell["live_runs"], cell["sim_run_noise"]["runs"])):
        saved = run["records"]
        speed = tuple(read["speed"][g] for g in ("encode", "prefill", "decode"))
        result = simulate(layout, profile, reqs, share, cores, routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i,
                          loop_share=loop, speed=speed,
                          noise=HostNoise(sigma=read["sigma"], period_s=read["period_s"], seed=k))
        sim = {x.request.request_id: x.ttft for x in result.records}
        rows = np.array([(sim[q.request_id] - saved["ttft"][j], busy, saved["ttft"][j], sim[q.request_id])
                         for j, (q, busy) in enumerate(zip(reqs, decoding_at_arrival(saved, n)))
                         if not saved["error"][j]])
        for busy in sorted(set(rows[:, 1].astype(int))):
            m = rows[:, 1] == busy
            print(f"{name} {rate:g} req/s run {k + 1}, {busy} others decoding: n={m.sum():3d}  sim - live TTFT p50 "
                  f"{np.median(rows[m, 0]) * 1e3:+.1f} ms, mean {rows[m, 0].mean() * 1e3:+.1f}  (live p50 "
                  f"{np.median(rows[m, 2]) * 1e3:.1f}, sim p50 {np.median(rows[m, 3]) * 1e3:.1f})")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
