"""Encode dispatch policies side by side: pass-through, fixed timeout and EAServe's adaptive rule.

Brings up the local CPU cluster once, and for each arrival rate and policy (switched live through
PUT /v1/admin/policy) replays the same open-loop Poisson trace of image+text requests, streaming, and
measures at the client: TTFT, TPOT, goodput (requests meeting TTFT <= --slo-ttft AND TPOT <= --slo-tpot,
per second of the run) and the encoder batch sizes the policy formed. Writes JSON with the command.

On a CPU the encoder gains little from batching (about 1.25x per image at batch 8 for the tiny model),
so this checks correct behaviour and no regression; GPU gains are for benchmarks/gpu/.

    python -m benchmarks.control_point --rates 2 6 12 --requests 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
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
from coordinator.planner.durations import duration_arg
from coordinator.policies.base import BatchPolicyConfig
from coordinator.redis_server import free_port

POLICIES = {
    "pass_through": {"name": "pass_through"},
    "fixed_timeout": {"name": "fixed_timeout", "max_batch": 8, "timeout_s": 0.05},
    "adaptive": {"name": "adaptive", "max_batch": 8, "fill_probability": 0.6, "max_wait_s": 1.0},
    "adaptive_planned": {"name": "adaptive", "fill_probability": 0.6},
    "adaptive_conserving": {"name": "adaptive", "max_batch": 8, "fill_probability": 0.6, "max_wait_s": 1.0,
                            "work_conserving": True},
}
"""adaptive = EAServe's defaults (B=8, A=1 s). adaptive_planned = the same rule with the knobs the planner
seeds (HAS stage 2): B = ceil(rate / encode workers), and the age cap A = --planned-wait-share of the TTFT
SLO, so a batch never spends more of the latency budget than that waiting to fill. adaptive_conserving =
EAServe's defaults, work-conserving: an idle encoder gets what is queued at once, and the rule only forms
the batches that wait behind a busy one (BatchPolicyConfig.work_conserving)."""


def policy_for(name: str, rate: float, encode_workers: int, slo_ttft: float, wait_share: float) -> dict:
    if name != "adaptive_planned":
        return POLICIES[name]
    return {**POLICIES[name], "max_batch": max(1, math.ceil(rate / encode_workers)),
            "max_wait_s": round(wait_share * slo_ttft, 4)}


async def _one(client: httpx.AsyncClient, i: int, max_tokens: int) -> dict:
    body = {"model": "tiny-llava", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(demo_image(i % 6))}},
                {"type": "text", "text": "Describe this image."}]}]}
    t0 = time.perf_counter()
    stamps, tokens = [], 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"ok": False, "error": (await r.aread()).decode()[:200]}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c["delta"].get("content") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())
    if not stamps:
        return {"ok": False, "error": "no tokens"}
    return {"ok": True, "ttft": stamps[0] - t0, "e2e": stamps[-1] - t0,
            "tpot": (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 else 0.0}


async def run_trace(url: str, gaps: list[float], max_tokens: int, progress: Progress, label: str,
                    one=None, timeout_s: float = 120) -> tuple[list[dict], float]:
    """Open loop: request i starts at sum(gaps[:i]) whatever the earlier ones are doing; `one(client, i,
    max_tokens)` sends request i (default: a streaming image request measuring TTFT/TPOT)."""
    one = one or _one
    task = progress.add_task(label, total=len(gaps))
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        start = time.perf_counter()

        async def at(i: int, offset: float) -> dict:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            out = await one(client, i, max_tokens)
            progress.advance(task)
            return out

        offsets = [sum(gaps[: i + 1]) for i in range(len(gaps))]
        rows = await asyncio.gather(*(at(i, off) for i, off in enumerate(offsets)))
        return rows, time.perf_counter() - start


def summarize(rows: list[dict], wall_s: float, slo_ttft: float, slo_tpot: float, batches: dict) -> dict:
    ok = [r for r in rows if r["ok"]]
    good = [r for r in ok if r["ttft"] <= slo_ttft and r["tpot"] <= slo_tpot]
    ttft, tpot = [r["ttft"] for r in ok], [r["tpot"] for r in ok]
    ms = lambda v: None if v is None else round(v * 1e3, 2)  # noqa: E731
    return {"requests": len(rows), "failed": len(rows) - len(ok), "wall_s": round(wall_s, 3),
            "goodput_rps": round(len(good) / wall_s, 4), "slo_attainment": round(len(good) / len(rows), 4),
            "ttft_ms": {"p50": ms(percentile(ttft, 0.5)), "p99": ms(percentile(ttft, 0.99)), "mean": ms(statistics.mean(ttft))},
            "tpot_ms": {"p50": ms(percentile(tpot, 0.5)), "p99": ms(percentile(tpot, 0.99))},
            "encode_batches": batches}


def _batch_histogram(url: str) -> dict[str, float]:
    """Cumulative encode batch-size histogram from the coordinator's Prometheus metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("tierserve_encode_batch_size_count") or line.startswith("tierserve_encode_batch_size_sum"):
            name, value = line.split()
            out[name.rsplit("_", 1)[1]] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.control_point", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 6.0, 12.0], help="arrival rates, req/s")
    p.add_argument("--requests", type=int, default=60, help="requests per (rate, policy) cell")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--slo-ttft", type=duration_arg("--slo-ttft"), default="1s", metavar="TIME",
                   help="TTFT SLO with its unit, e.g. 1s or 800ms (default: %(default)s)")
    p.add_argument("--slo-tpot", type=duration_arg("--slo-tpot"), default="100ms", metavar="TIME",
                   help="TPOT SLO with its unit (default: %(default)s)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--planned-wait-share", type=float, default=0.1,
                   help="adaptive_planned: the age cap A as a share of the TTFT SLO (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/control_point.json"))
    a = p.parse_args(argv)
    if a.requests < 1 or any(r <= 0 for r in a.rates):
        p.error("--requests must be >= 1 and every rate > 0")
    console = Console()
    results: dict[str, dict[str, dict]] = {}
    with LocalCluster(ClusterSpec(port=free_port())) as cluster, Progress(console=console) as progress:
        asyncio.run(run_trace(cluster.url, [0.1] * 4, a.max_tokens, progress, "warm-up"))
        for rate in a.rates:
            rng = random.Random(a.seed)
            gaps = [rng.expovariate(rate) for _ in range(a.requests)]  # the same trace for every policy
            for name in a.policies:
                knobs = policy_for(name, rate, 1, a.slo_ttft, a.planned_wait_share)
                full = BatchPolicyConfig(**knobs).model_dump(mode="json")  # PUT merges: unsaid knobs would linger
                httpx.put(f"{cluster.url}/v1/admin/policy", json={"batch": full}, timeout=10).raise_for_status()
                before = _batch_histogram(cluster.url)
                rows, wall = asyncio.run(run_trace(cluster.url, gaps, a.max_tokens, progress, f"{rate:g} req/s {name}"))
                after = _batch_histogram(cluster.url)
                n = after.get("count", 0) - before.get("count", 0)
                batches = {"count": n, "mean_size": round((after.get("sum", 0) - before.get("sum", 0)) / n, 3) if n else None}
                results.setdefault(f"{rate:g}", {})[name] = summarize(rows, wall, a.slo_ttft, a.slo_tpot, batches) | {
                    "knobs": knobs}
    for by in results.values():  # every policy against pass-through, within the same run
        base = by.get("pass_through", {}).get("goodput_rps")
        for cell in by.values():
            cell["goodput_vs_pass_through"] = round(cell["goodput_rps"] / base, 3) if base else None
    report = {"command": "python -m benchmarks.control_point " + " ".join(sys.argv[1:] if argv is None else argv),
              "slo": {"ttft_s": a.slo_ttft, "tpot_s": a.slo_tpot}, "policies": {k: POLICIES[k] for k in a.policies}, "planned_wait_share": a.planned_wait_share,
              "cluster": "1 encode + 1 combined worker, tiny-llava, 2 CPU cores",
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rates": results}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    table = Table(title=f"encode dispatch policies (SLO: TTFT <= {a.slo_ttft}s, TPOT <= {a.slo_tpot}s)")
    for col in ("rate", "policy", "goodput/s", "vs pass", "SLO met", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "batch"):
        table.add_column(col, justify="right")
    for rate, by in results.items():
        for name, s in by.items():
            table.add_row(rate, name, f"{s['goodput_rps']:.2f}", f"x{s['goodput_vs_pass_through']}", f"{s['slo_attainment']:.0%}", str(s["ttft_ms"]["p50"]),
                          str(s["ttft_ms"]["p99"]), str(s["tpot_ms"]["p50"]), str(s["tpot_ms"]["p99"]),
                          str(s["encode_batches"]["mean_size"]))
    console.print(table)
    console.print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
