"""Per-request overhead of the serving path: end-to-end time outside encode/prefill/decode compute.

Brings up a local cluster, sends image+text requests at a fixed concurrency (1, 4, 16 by default),
and for each request takes the coordinator's own accounting: e2e (request received -> last token
relayed) and the wall time of the encoder batch and engine steps the request was part of. Overhead =
e2e - compute: HTTP parsing, prompt building, Redis hops, queueing between steps, transport, relay.
Writes JSON (with the command line that produced it) and prints a table.

    python -m benchmarks.overhead --concurrency 1 4 16 --requests 48
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.stats import percentile
from coordinator.demo import data_url, demo_image
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port


async def _one(client: httpx.AsyncClient, i: int, max_tokens: int) -> dict:
    body = {"model": "tiny-llava", "max_tokens": max_tokens, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(demo_image(i % 6))}},
        {"type": "text", "text": "Describe this image."}]}]}
    t0 = time.perf_counter()
    r = await client.post("/v1/chat/completions", json=body)
    client_e2e = time.perf_counter() - t0
    r.raise_for_status()
    m = r.json()["tierserve"]
    m["client_e2e_s"] = client_e2e
    return m


async def run_level(url: str, concurrency: int, n: int, max_tokens: int, progress: Progress) -> list[dict]:
    task = progress.add_task(f"concurrency {concurrency}", total=n)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def guarded(i: int) -> dict:
            async with sem:
                out = await _one(client, i, max_tokens)
                progress.advance(task)
                return out
        return await asyncio.gather(*(guarded(i) for i in range(n)))


def summarize(rows: list[dict]) -> dict:
    over = [r["overhead_s"] for r in rows]
    e2e = [r["e2e_s"] for r in rows]
    comp = [r["e2e_s"] - r["overhead_s"] for r in rows]
    frac = [o / e for o, e in zip(over, e2e)]
    transfer = [r["compute"]["transfer_s"] for r in rows]
    return {
        "requests": len(rows),
        "overhead_ms": {"mean": statistics.mean(over) * 1e3, "p50": percentile(over, 0.5) * 1e3, "p90": percentile(over, 0.9) * 1e3},
        "compute_ms_mean": statistics.mean(comp) * 1e3,
        "e2e_ms": {"mean": statistics.mean(e2e) * 1e3, "p50": percentile(e2e, 0.5) * 1e3, "p90": percentile(e2e, 0.9) * 1e3},
        "client_e2e_ms_mean": statistics.mean(r["client_e2e_s"] for r in rows) * 1e3,
        "overhead_fraction_of_e2e": {"mean": statistics.mean(frac), "p50": percentile(frac, 0.5)},
        "transfer_ms_mean": statistics.mean(transfer) * 1e3,
        "stages_ms_mean": _stage_means(rows),
    }


def _stage_means(rows: list[dict]) -> dict[str, float]:
    """Mean time between consecutive hops (received -> submitted -> encode_start -> ... -> relayed)."""
    names: dict[str, list[float]] = {}
    for r in rows:
        for name, s in (r.get("stages_s") or {}).items():
            names.setdefault(name, []).append(s)
    return {name: statistics.mean(v) * 1e3 for name, v in names.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="levels to measure")
    p.add_argument("--requests", type=int, default=48, help="requests per level (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--llm", default="combined", help="LLM worker roles, as for `tierserve up --llm`")
    p.add_argument("--encode", type=int, default=1)
    p.add_argument("--redis-url", default=None, help="default: a private redis-server")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead.json"))
    a = p.parse_args(argv)
    if a.requests < 1 or any(c < 1 for c in a.concurrency):
        p.error("--requests and every --concurrency level must be >= 1")
    console = Console()
    spec = ClusterSpec(encode_workers=a.encode, llm_roles=a.llm.split(","), redis_url=a.redis_url, port=free_port())
    results = {}
    with LocalCluster(spec) as cluster, Progress(console=console) as progress:
        asyncio.run(run_level(cluster.url, 2, 4, a.max_tokens, progress))  # warm-up, not reported
        for c in a.concurrency:
            results[str(c)] = summarize(asyncio.run(run_level(cluster.url, c, a.requests, a.max_tokens, progress)))
    report = {
        "command": "python -m benchmarks.overhead " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "per-request e2e minus the wall time of the encode batch and engine steps it was part of",
        "cluster": {"encode": a.encode, "llm": a.llm, "model": "tiny-llava", "max_tokens": a.max_tokens},
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "levels": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    table = Table(title="serving-path overhead per request (ms)")
    for col in ("concurrency", "overhead p50", "overhead p90", "compute mean", "e2e p50", "overhead / e2e"):
        table.add_column(col, justify="right")
    for c, s in results.items():
        table.add_row(c, f"{s['overhead_ms']['p50']:.1f}", f"{s['overhead_ms']['p90']:.1f}",
                      f"{s['compute_ms_mean']:.1f}", f"{s['e2e_ms']['p50']:.1f}",
                      f"{s['overhead_fraction_of_e2e']['mean']:.1%}")
    console.print(table)
    stages = Table(title="where the time goes: mean ms between hops")
    stages.add_column("hop")
    for c in results:
        stages.add_column(f"c={c}", justify="right")
    for hop in results[str(a.concurrency[0])]["stages_ms_mean"]:
        stages.add_row(hop, *(f"{results[c]['stages_ms_mean'].get(hop, float('nan')):.1f}" for c in results))
    console.print(stages)
    console.print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
