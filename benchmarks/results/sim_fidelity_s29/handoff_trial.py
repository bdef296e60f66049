"""Trial of tails.py's diagnosis: re-simulate the cells with a P -> D hand-off at each run's speed and host noise
(as sim_fidelity_layouts.judge reads them), the KV hand-off's time taken from the live run's own marks (first token
-> the decode worker admitted it, the span the profile's hop_s is for the embeddings) instead of the profile's
embeddings hop; the receiving engine's admit_s still follows on its admitting step, as for any transfer. Two ways:
"own", each request's own live hand-off (in arrival order, as the workload is the live one; a draw where a
request has none); "drawn", a seeded draw from the run's hand-offs (the distribution without the order). Goodput,
P50 TTFT and mean TPOT errors against the live means, beside judge's. Analysis only: it replaces one method of this process's simulator.

    python benchmarks/results/sim_fidelity_s29/handoff_trial.py <judged.json> [layout ...]

(layouts: epd and colocated_prefill by default, the two with a P -> D hand-off)
"""

from __future__ import annotations

import json
import random
import sys

from benchmarks.sim_fidelity_layouts import (IMAGE_REQUESTS_BEFORE, LAYOUTS, METRICS, SLO, Profile,
                                             coordinator_share, hop_in_share, simulate, stack_shares, workload)
from coordinator.planner import sim as sim_module
from coordinator.planner.sim_noise import HostNoise

HAND_OFF: dict = {"of": None}
"""request id -> live hand-off seconds for the run simulated now (None: the model's own transfer)."""


def _use_live_hand_offs() -> None:
    cluster = sim_module.Cluster
    model = cluster.hand_off_kv

    def hand_off_kv(self, f, tier, host, now):
        live = HAND_OFF["of"]
        if live is None:
            return model(self, f, tier, host, now)
        dst = self.least_loaded(self.decoders)
        f.record.decode_node = dst.name
        dst.incoming += 1
        self.events.at(now + max(0.0, live[f.record.request.request_id] - dst.engine.admit_s()), dst.receive, f)

    cluster.hand_off_kv = hand_off_kv


def live_hand_offs(saved: dict, ids: list[int], way: str, seed: int) -> dict[int, float]:
    spans = [m["decode_admitted"] - m["first_token"] if "decode_admitted" in m and "first_token" in m else None
             for m in saved["marks"]]
    known = [s for s in spans if s is not None]
    rng = random.Random(seed)
    out = {}
    for rid, span in zip(ids, spans):
        out[rid] = rng.choice(known) if way == "drawn" or span is None else span
    return out


def judged_cells(data: dict, layouts: list[str]):
    """Each cell of a judged record set that judge simulated at its runs' speed and noise, with what re-simulating it
    needs: (layout name, Layout, SLO, the stack's readings (hop_in_share, stack_shares, coordinator_share), the
    cell's index, the cell, its profile, its requests)."""
    n = data["requests_per_rate"]
    for report in data["layouts"]:
        if report["layout"] not in layouts:
            continue
        layout, slo = LAYOUTS[report["layout"]], SLO.model_validate(report["slo"])
        stack = hop_in_share(report), stack_shares(report, layout), coordinator_share(report)
        for i, cell in enumerate(report["cells"]):
            if "sim_run_noise" not in cell:
                continue
            profile = Profile.model_validate(cell["profile"])
            reqs = workload(cell["rate"], profile.encode["image"].tokens_per_item).generate(n, seed=data["seed"])
            yield report["layout"], layout, slo, stack, i, cell, profile, reqs


def simulate_run(layout, profile, reqs, stack, i: int, n: int, read: dict, k: int, **kw):
    """One live run of cell `i` re-simulated at its speed and host noise as judge read them (`read`; seed `k`)."""
    share, cores, loop = stack
    speed = tuple(read["speed"][g] for g in ("encode", "prefill", "decode"))
    return simulate(layout, profile, reqs, share, cores, routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i,
                    loop_share=loop, speed=speed, noise=HostNoise(sigma=read["sigma"], period_s=read["period_s"], seed=k),
                    **kw)


def main(path: str, layouts: list[str]) -> None:
    _use_live_hand_offs()
    data = json.load(open(path))
    n = data["requests_per_rate"]
    for name, layout, slo, stack, i, cell, profile, reqs in judged_cells(data, layouts or ["epd", "colocated_prefill"]):
        line = [f"{name:18s} {cell['rate']:4g} req/s  judge " +
                " ".join(f"{cell['error_run_noise'][m]:+.0%}" for m in METRICS)]
        for way in ("model", "own", "drawn"):
            figs = []
            for k, (run, read) in enumerate(zip(cell["live_runs"], cell["sim_run_noise"]["runs"])):
                HAND_OFF["of"] = (None if way == "model" else
                                  live_hand_offs(run["records"], [r.request_id for r in reqs], way, k))
                s = simulate_run(layout, profile, reqs, stack, i, n, read, k, record_compute=True).summary(slo)
                figs.append({m: getattr(s, m) for m in METRICS})
            errs = [sum(f[m] for f in figs) / len(figs) / cell["live_mean"][m] - 1 for m in METRICS]
            within = " ok" if all(abs(e) <= 0.1 for e in errs) else ""
            line.append(f"{way} " + " ".join(f"{e:+.0%}" for e in errs) + within)
        print("  |  ".join(line), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
