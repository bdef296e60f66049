"""Where a judged record set's goodput misses come from: per cell, live against the simulation at each run's speed
and host noise (as sim_fidelity_layouts.judge reads them), the share of requests over the SLO's TTFT and over its
TPOT, the TPOT percentiles, the decode phase's time outside the workers' step compute per token, and (layouts with a
P -> D hand-off) the KV hand-off: live from the first token's mark to the decode worker's admission, simulated from
the end of the prefill step to the decode worker receiving it (the receiver's admit_s follows on its step).

    python benchmarks/results/sim_fidelity_s29/tails.py <judged.json> [layout ...]
"""

from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks.sim_fidelity_layouts import (IMAGE_REQUESTS_BEFORE, LAYOUTS, SLO, Profile, coordinator_share,
                                             hop_in_share, loaded_records, simulate, stack_shares, workload)
from coordinator.planner import sim as sim_module
from coordinator.planner import sim_llm
from coordinator.planner.sim_noise import HostNoise

Q = (10, 50, 90, 95)
SENT: dict[int, float] = {}
LANDED: dict[int, float] = {}


def _pct(xs: list[float], scale: float = 1e3, nd: int = 2) -> list[float]:
    return [round(float(np.percentile(xs, q)) * scale, nd) for q in Q] if xs else []


def _watch_hand_offs() -> None:
    """Note when the simulated KV hand-offs leave and land (analysis only: wraps two methods of this process)."""
    cluster = sim_module.Cluster
    send, land = cluster.hand_off_kv, sim_llm.LLMNode.receive

    def hand_off_kv(self, f, tier, host, now):
        SENT[f.record.request.request_id] = now
        return send(self, f, tier, host, now)

    def receive(self, f):
        LANDED[f.record.request.request_id] = self.cluster.events.now
        return land(self, f)

    cluster.hand_off_kv, sim_llm.LLMNode.receive = hand_off_kv, receive


def misses(ttft: list[float], tpot: list[float], slo: SLO) -> str:
    t, p = np.array(ttft), np.array(tpot)
    return (f"over TTFT {np.mean(t > slo.ttft_s):.0%}, over TPOT {np.mean(p > slo.tpot_s):.0%}, "
            f"TPOT ms {_pct(tpot)}")


def main(path: str, layouts: list[str]) -> None:
    _watch_hand_offs()
    data = json.load(open(path))
    n = data["requests_per_rate"]
    for report in data["layouts"]:
        if layouts and report["layout"] not in layouts:
            continue
        layout, slo = LAYOUTS[report["layout"]], SLO.model_validate(report["slo"])
        share, cores, loop = hop_in_share(report), stack_shares(report, layout), coordinator_share(report)
        print(f"## {report['layout']} (SLO TTFT {slo.ttft_s * 1e3:g} ms, TPOT {slo.tpot_s * 1e3:g} ms)")
        for i, cell in enumerate(report["cells"]):
            if "sim_run_noise" not in cell:
                continue
            profile = Profile.model_validate(cell["profile"])
            reqs = workload(cell["rate"], profile.encode["image"].tokens_per_item).generate(n, seed=data["seed"])
            print(f"{cell['rate']:g} req/s: goodput error {cell['error_run_noise']['goodput_rps']:+.1%} "
                  f"(noise floor {cell['noise_floor']['goodput_rps']:.1%})")
            for k, (run, read) in enumerate(zip(cell["live_runs"], cell["sim_run_noise"]["runs"])):
                saved = run["records"]
                ok = [(j, r) for j, r in enumerate(loaded_records(saved, reqs)) if r.ok]
                outside = [(r.tpot - saved["decode_s"][j] / (r.output_tokens - 1))
                           for j, r in ok if r.output_tokens > 4 and saved["decode_s"][j]]
                hand = [m["decode_admitted"] - m["first_token"] for m in saved["marks"]
                        if "decode_admitted" in m and "first_token" in m]
                print(f"  run {k + 1} live: {misses([r.ttft for _, r in ok], [r.tpot for _, r in ok], slo)}; "
                      f"outside compute ms/token {_pct(outside, nd=3)}" + (f"; hand-off ms {_pct(hand)}" if hand else ""))
                SENT.clear()
                LANDED.clear()
                speed = tuple(read["speed"][g] for g in ("encode", "prefill", "decode"))
                result = simulate(layout, profile, reqs, share, cores,
                                  routed_before=IMAGE_REQUESTS_BEFORE + 2 * n * i, loop_share=loop, speed=speed,
                                  record_compute=True,
                                  noise=HostNoise(sigma=read["sigma"], period_s=read["period_s"], seed=k))
                recs = result.records
                outside = [r.tpot - result.decode_compute_s[r.request.request_id] / (r.request.output_tokens - 1)
                           for r in recs if r.request.output_tokens > 4 and r.request.request_id in result.decode_compute_s]
                hand = [LANDED[i] - SENT[i] for i in SENT if i in LANDED]
                print(f"        sim:  {misses([r.ttft for r in recs], [r.tpot for r in recs], slo)}; "
                      f"outside compute ms/token {_pct(outside, nd=3)}" + (f"; transfer ms {_pct(hand)}" if hand else ""))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
