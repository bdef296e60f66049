"""Trial (session 22): does the epd layout's live TPOT under load depend on the direct links?

Two live epd clusters (tiny LLaVA; encode + prefill on core 0, decode on core 1), one with the coordinator's
default direct links and one with --no-direct-links, replayed alternately with the same requests (sim_fidelity's
workload) at one rate; prints per run the client TPOT, the decode worker's own decode time per token, TTFT p50
and the decode worker's CPU.

    python benchmarks/results/sim_fidelity_trials22/ab_links.py RATE ROUNDS OUT.json
"""
import dataclasses
import json
import statistics as st
import sys

from rich.console import Console
from rich.progress import Progress

from benchmarks.sim_fidelity import workload
from benchmarks.sim_fidelity_layouts import LAYOUTS
from benchmarks.sim_fidelity_live import live_run, pin, put_policy
from coordinator.launcher import LocalCluster
from coordinator.planner.replay import HttpReplayer

rate, rounds, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lay = LAYOUTS["epd"]
specs = {"links": lay.spec(), "streams": dataclasses.replace(lay.spec(), coordinator_args=["--no-direct-links"],
                                                                 key_prefix="tsfid-epd-streams")}
specs["streams"] = dataclasses.replace(specs["streams"], port=specs["links"].port + 1)
rows = []
with LocalCluster(specs["links"]) as a, LocalCluster(specs["streams"]) as b, Progress(transient=True) as progress:
    clusters = {"links": a, "streams": b}
    for c in clusters.values():
        pin(c, lay.pins)
        put_policy(c.url, lay)
    reps = {k: HttpReplayer(c.url) for k, c in clusters.items()}
    reqs = workload(rate, 196).generate(120, seed=0)
    for k in reps:
        live_run(reps[k], workload(rate, 196).generate(20, seed=1000), lay.slo, progress, f"{k} warm-up")
    for r in range(rounds):
        for k in (("links", "streams") if r % 2 == 0 else ("streams", "links")):
            groups = {n: [p.pid] for n, p in clusters[k].procs.items()}
            run = live_run(reps[k], reqs, lay.slo, progress, f"{k} round {r}", groups)
            rec = run["records"]
            tp = [(e - t) / (n - 1) for e, t, n, err in zip(rec["e2e"], rec["ttft"], rec["output_tokens"], rec["error"])
                  if not err and n > 1]
            wd = [d / (n - 1) for d, n, err in zip(rec["decode_s"], rec["output_tokens"], rec["error"])
                  if not err and n > 1 and d is not None]
            row = {"cluster": k, "round": r, "tpot_ms": 1e3 * st.mean(tp), "worker_decode_ms": 1e3 * st.mean(wd),
                   "ttft_p50_ms": 1e3 * st.median(rec["ttft"]), "cpu": run["cpu_by_core"]}
            rows.append(row)
            Console().print(f"{k:8s} round {r}: TPOT {row['tpot_ms']:.2f} ms, worker decode {row['worker_decode_ms']:.2f}"
                            f" ms/token, TTFT p50 {row['ttft_p50_ms']:.1f} ms, decode worker CPU "
                            f"{sum(run['cpu_by_core'].get('llm-0-decode', {}).values()):.3f}")
json.dump({"command": " ".join(sys.argv), "rate": rate, "rows": rows}, open(out, "w"), indent=1)
