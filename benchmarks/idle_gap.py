"""Time to first token by stage after an idle gap: is a request slower when the cluster has been idle?

The simulator's P50 TTFT is too low on every layout (benchmarks/results/sim_fidelity_layouts.at-6e6191d.md,
-11 to -19 % in five cells), most at the lower rates. Its service times come from profiles whose requests are
paced `ProfileSettings.pause_s` (0.1 s) apart, while Poisson arrivals at 3-9 req/s leave gaps of 0.1-0.3 s on
average and often longer. This measures the same single request (one image, 4 output tokens, streamed) on a
local pinned cluster (1 encode + 1 combined worker, as `tierserve profile` starts) after each of several idle
gaps, in a shuffled order, and splits its TTFT into the fidelity report's stages (coordinator/planner/
ttft_stages.py: to_encode, encode, to_first_token, to_client) from the coordinator's per-hop marks.

    python -m benchmarks.idle_gap --gaps-ms 20 100 200 330 500 1000 --requests 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress

from benchmarks.bench.report import write_json
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.live_http import chat_body
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.ttft_stages import STAGES as TTFT_STAGES
from coordinator.planner.ttft_stages import live_stages
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port

STAGES = (*TTFT_STAGES, "ttft")
WORDS, TOKENS = 4, 4
"""Filler words beside the one image, and output tokens, of every request."""


async def one_request(client: httpx.AsyncClient, body: dict) -> tuple[float, ...]:
    """(to_encode, encode, to_first_token, to_client, ttft) seconds of one streamed request: the replayer's own
    request (replay.stream_request) and stage split (ttft_stages.live_stages)."""
    record = ReplayRecord(SimRequest(0, 0.0, "image", 1, 0, WORDS, TOKENS))
    await stream_request(client, record, body, time.perf_counter(), 0.0)
    stages = live_stages([record])
    if record.error is not None or not stages:
        raise RuntimeError(f"a request failed or carried no per-hop marks: {record.error or sorted(record.marks)}")
    return (*(stages[k] for k in TTFT_STAGES), record.ttft)


async def measure(url: str, order: list[float], warmup: int, progress: Progress) -> dict[float, list[tuple[float, ...]]]:
    """Each request after its idle gap (ms), one at a time; the warm-up ones unrecorded."""
    body = chat_body("tiny-llava", WORDS, 1, TOKENS, stream=True)
    rows: dict[float, list[tuple[float, ...]]] = {g: [] for g in order}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(warmup):
            await one_request(client, body)
        task = progress.add_task("requests after idle gaps", total=len(order))
        for gap in order:
            await asyncio.sleep(gap / 1e3)
            rows[gap].append(await one_request(client, body))
            progress.advance(task)
    return rows


def quartiles(xs: list[float]) -> list[float]:
    """p25, p50, p75 in milliseconds."""
    q = statistics.quantiles(xs, n=4)
    return [round(v * 1e3, 2) for v in (q[0], statistics.median(xs), q[2])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.idle_gap", description=__doc__.split("\n\n")[0])
    p.add_argument("--gaps-ms", type=float, nargs="+", default=[20, 100, 200, 330, 500, 1000],
                   help="idle gaps before a request, in ms (default: %(default)s)")
    p.add_argument("--requests", type=int, default=30, help="requests per gap (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured requests first (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="shuffles the order of the gaps")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/idle_gap.json"))
    a = p.parse_args(argv)
    if a.requests < 2 or min(a.gaps_ms) < 0:
        p.error("--requests must be >= 2 and every --gaps-ms >= 0")
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], pin_cores=True, port=free_port(), key_prefix="idle-gap")
    order = [g for g in a.gaps_ms for _ in range(a.requests)]
    random.Random(a.seed).shuffle(order)
    console = Console(stderr=True)
    with LocalCluster(spec) as cluster, Progress(console=console, transient=True) as progress:
        rows = asyncio.run(measure(cluster.url, order, a.warmup, progress))
    base = min(a.gaps_ms)
    table = {}
    for g in a.gaps_ms:
        table[str(g)] = {s: quartiles([r[i] for r in rows[g]]) for i, s in enumerate(STAGES)}
    report = {
        "command": "python -m benchmarks.idle_gap " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0]},
        "cluster": "1 encode + 1 combined worker, each pinned to its own core; coordinator and Redis float",
        "request": "one image + 4 filler words, 4 output tokens, greedy, streamed",
        "what": "per gap (ms) and stage: p25 / p50 / p75 in ms over the requests sent after that idle gap",
        "stages_ms": table,
        "p50_over_shortest_gap": {str(g): {s: round(table[str(g)][s][1] / table[str(base)][s][1], 3)
                                           for s in STAGES} for g in a.gaps_ms},
    }
    write_json(a.out, report)
    lines = ["| gap ms | " + " | ".join(f"{s} p50 (p25-p75)" for s in STAGES) + " |", "|---" * (len(STAGES) + 1) + "|"]
    for g in a.gaps_ms:
        t = table[str(g)]
        lines.append(f"| {g:g} | " + " | ".join(f"{t[s][1]:.1f} ({t[s][0]:.1f}-{t[s][2]:.1f})" for s in STAGES) + " |")
    print("\n".join(lines))
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
