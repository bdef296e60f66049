"""Whose CPU a decoding worker's core runs: the worker's own share of its wall time while it decodes.

The simulator puts the serving stack's jobs (the coordinator's hops, the token relay, Redis, the client) on the
cluster's cores beside the pinned workers (coordinator/planner/sim_stack.py). Where they run decides whom they
slow: a relay job beside a decoding worker stretches its steps. This measures it on the live one-host cluster:
bursts of streamed requests decoding together (`--batches`, text only, `--output-tokens` each), and for every
burst the CPU seconds of each worker and of the coordinator (/proc, all threads) over the burst's wall time, and
the wall time per engine step (output tokens: one step each).

  default   1 encode + 1 combined worker, each pinned (the profiling cluster, `tierserve profile`'s): a worker
            whose share stays near 1.0 kept its core to itself while the stack relayed its tokens.
  --pair    colocated_prefill's cluster (sim_fidelity_layouts): its combined (P+D) and decode (D) workers share
            core 1. Image requests routed by the offload knob s: 0 all to P+D, 1 all to D (prefilled beside the
            encoder), 0.5 half each; per request its TPOT and engine-step time per token (decode_s), alone and
            with both workers decoding at once.

    python -m benchmarks.worker_cpu --out benchmarks/results/worker_cpu.json
    python -m benchmarks.worker_cpu --pair --out benchmarks/results/worker_cpu_pair.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress

from benchmarks.bench.report import write_json
from benchmarks.process_profile import cpu_seconds
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.live_http import ask, chat_body, served_model
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port

PAIR_ROUTES = ((0.0, "P+D alone"), (1.0, "D alone"), (0.5, "both"))


async def burst(client: httpx.AsyncClient, model: str, n: int, out: int, image: bool) -> list[ReplayRecord]:
    """`n` streamed requests at once, `out` tokens each; their records (marks and compute from the server)."""
    t0 = time.perf_counter()
    records = [ReplayRecord(SimRequest(i, 0.0, "image", int(image), 1, 8, out)) for i in range(n)]
    await asyncio.gather(*(stream_request(client, r, chat_body(model, 8, int(image), out, stream=True), t0, 0.0)
                           for r in records))
    failed = [r.error for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"a burst request failed: {failed[0]}")
    return records


def per_request(records: list[ReplayRecord]) -> list[dict]:
    """Each request's decode worker (D after a KV hand-off, else P+D), TPOT and engine-step time per token, ms."""
    rows = []
    for r in records:
        k = max(1, r.output_tokens - 1)
        rows.append({"worker": "D" if "handoff_sent" in r.marks else "P+D",
                     "tpot_ms": round((r.e2e - r.ttft) / k * 1e3, 3),
                     "step_ms": round(r.compute.get("decode_s", 0.0) / k * 1e3, 3)})
    return sorted(rows, key=lambda x: x["worker"])


async def measure(url: str, pids: dict[str, int], plan: list[tuple[float | None, int]], out: int, image: bool,
                  progress: Progress) -> list[dict]:
    """One burst per (s, batch) of `plan` (s None: leave the policy alone); each burst's CPU shares and rows."""
    task = progress.add_task("bursts", total=len(plan))
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        model = await served_model(client)
        for _ in range(4):
            await ask(client, chat_body(model, 8, 1, 4))
        for s, n in plan:
            if s is not None:
                policy = (await client.get("/v1/admin/policy")).json()
                policy["offload"]["s"] = s
                (await client.put("/v1/admin/policy", json=policy)).raise_for_status()
                await asyncio.sleep(1.2)  # the encode worker reads the knobs once a second
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.perf_counter()
            records = await burst(client, model, n, out, image)
            wall = time.perf_counter() - t0
            rows.append({"s": s, "batch": n, "wall_s": round(wall, 4),
                         "wall_per_step_ms": round(wall / out * 1e3, 3),
                         "cpu_per_wall": {k: round((cpu_seconds(p) - before[k]) / wall, 3) for k, p in pids.items()},
                         "requests": per_request(records)})
            progress.advance(task)
            await asyncio.sleep(0.5)
    return rows


def run(pair: bool, batches: list[int], rounds: int, out_tokens: int, console: Console) -> list[dict]:
    if pair:
        import benchmarks.sim_fidelity_layouts as layouts
        from benchmarks.sim_fidelity_live import pin, put_policy

        layout = layouts.LAYOUTS["colocated_prefill"]
        spec = layout.spec()
        plan = [(s, n * (2 if s == 0.5 else 1)) for _ in range(rounds) for n in batches for s, _ in PAIR_ROUTES]
    else:
        spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True,
                           key_prefix="tsworkercpu")
        plan = [(None, n) for _ in range(rounds) for n in batches]
    with LocalCluster(spec) as cluster:
        if pair:
            pin(cluster, layout.pins)
            put_policy(cluster.url, layout)
        pids = {name: p.pid for name, p in cluster.procs.items() if name.startswith(("llm", "coordinator"))}
        with Progress(console=console, transient=True) as progress:
            return asyncio.run(measure(cluster.url, pids, plan, out_tokens, image=pair, progress=progress))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", action="store_true", help="colocated_prefill's two LLM workers on one core")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4],
                   help="requests per burst (with --pair: per worker; 'both' sends twice as many)")
    p.add_argument("--rounds", type=int, default=2, help="times through the plan (default: 2)")
    p.add_argument("--output-tokens", type=int, default=300, help="tokens each request generates (default: 300)")
    p.add_argument("--out", type=Path, help="JSON to write")
    a = p.parse_args(argv)
    if min(a.batches) < 1 or a.rounds < 1 or a.output_tokens < 2:
        p.error("--batches and --rounds must be >= 1 and --output-tokens >= 2")
    console = Console(stderr=True)
    rows = run(a.pair, a.batches, a.rounds, a.output_tokens, console)
    for r in rows:
        console.print(r)
    if a.out:
        write_json(a.out, {"command": "python -m benchmarks.worker_cpu " + " ".join(sys.argv[1:] if argv is None else argv),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg(),
                           "cluster": "colocated_prefill" if a.pair else "1 encode + 1 combined, pinned",
                           "bursts": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
