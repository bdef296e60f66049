"""Soak: a long open-loop load at a share of measured capacity, with a `kill -9` of a random worker every
few minutes, on a supervised local cluster (as `tierserve up` runs it). Every answer is checked against the
fault-free one; the run reports requests sent, served, errored (explicit), wrong and lost, each process's
resident memory at start, after the warm-up and at the end, and Redis's memory. Written as JSON with the
command that made it.

    python -m benchmarks.soak --minutes 10 --load 0.7 --kill-every 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from pathlib import Path

import httpx
import redis
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from benchmarks.faults.inject import Supervising, kill9
from benchmarks.faults.load import SteadyLoad, counts, expected_answers, request_body, send
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port

IMAGES = list(range(6))


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def snapshot(cluster: LocalCluster) -> dict[str, dict]:
    return {name: {"pid": p.pid, "rss_mib": rss_mib(p.pid)} for name, p in cluster.procs.items()}


def redis_memory_mib(url: str) -> float:
    client = redis.Redis.from_url(url)
    try:
        return client.info("memory")["used_memory"] / 2**20
    finally:
        client.close()


async def capacity(url: str, model: str, max_tokens: int, seconds: float, concurrency: int) -> float:
    """Closed-loop throughput (req/s) with `concurrency` requests always in flight."""
    done, stop_at = 0, time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        async def loop(k: int) -> None:
            nonlocal done
            n = k
            while time.monotonic() < stop_at:
                status, _, error, _ = await send(client, url, request_body(model, IMAGES[n % len(IMAGES)],
                                                                          max_tokens=max_tokens), 120)
                done += status == 200 and error is None
                n += concurrency
        t0 = time.monotonic()
        await asyncio.gather(*(loop(k) for k in range(concurrency)))
        return done / (time.monotonic() - t0)


async def soak(cluster: LocalCluster, a: argparse.Namespace, console: Console) -> dict:
    url, model = cluster.url, cluster.spec.model_name
    expected = await expected_answers(url, model, IMAGES, a.max_tokens)
    cap = await capacity(url, model, a.max_tokens, a.capacity_seconds, a.capacity_concurrency)
    rate = a.load * cap
    console.print(f"capacity {cap:.2f} req/s (closed loop, {a.capacity_concurrency} in flight); soaking at "
                  f"{rate:.2f} req/s for {a.minutes:g} min")
    at_start = snapshot(cluster)
    redis_start = redis_memory_mib(cluster.redis_url)
    load = SteadyLoad(url, model, expected, rate=rate, max_tokens=a.max_tokens, error_bound_s=5.0)
    stop = asyncio.Event()
    running = asyncio.create_task(load.run(stop))
    rng = random.Random(a.seed)
    kills, after_warmup = [], None
    t0 = time.monotonic()
    total = a.minutes * 60
    with Progress(TextColumn("soak"), BarColumn(), TextColumn("{task.fields[kills]} kills"), TimeRemainingColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("soak", total=total, kills=0)
        next_kill = a.kill_every
        while (elapsed := time.monotonic() - t0) < total:
            await asyncio.sleep(min(1.0, total - elapsed))
            elapsed = time.monotonic() - t0
            progress.update(task, completed=elapsed)
            if after_warmup is None and elapsed >= a.warmup_seconds:
                after_warmup = snapshot(cluster)
            if elapsed >= next_kill:
                victims = [n for n, p in cluster.procs.items() if n != "coordinator" and p.poll() is None]
                victim = rng.choice(victims)
                kill9(cluster, victim)
                kills.append({"at_s": round(elapsed, 1), "worker": victim})
                progress.update(task, kills=len(kills))
                next_kill += a.kill_every
    stop.set()
    outcomes = await running
    at_end = snapshot(cluster)
    redis_end = redis_memory_mib(cluster.redis_url)
    processes = {}
    for name in at_end:
        s, w, e = at_start.get(name, {}), (after_warmup or at_start).get(name, {}), at_end[name]
        processes[name] = {"rss_start_mib": s.get("rss_mib"), "rss_after_warmup_mib": w.get("rss_mib"),
                           "rss_end_mib": e["rss_mib"], "restarted": s.get("pid") != e["pid"]}
    coord = processes["coordinator"]
    growth = lambda a0, a1: None if not a0 or not a1 else round(100 * (a1 / a0 - 1), 1)  # noqa: E731
    return {
        "capacity_req_s": round(cap, 3), "rate_req_s": round(rate, 3), "load_share": a.load,
        "minutes": a.minutes, "kills": kills, "outcomes": counts(outcomes),
        "not_served": [{"kind": o.kind, "detail": o.detail[:300]} for o in outcomes if o.kind != "served"][:50],
        "processes": processes,
        "coordinator_rss_growth_pct": {"from_start": growth(coord["rss_start_mib"], coord["rss_end_mib"]),
                                       "from_after_warmup": growth(coord["rss_after_warmup_mib"], coord["rss_end_mib"])},
        "redis_used_memory_mib": {"start": round(redis_start, 2), "end": round(redis_end, 2)},
        "supervisor_reports": [],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="soak length in minutes (default: %(default)s)")
    p.add_argument("--load", type=float, default=0.7, help="share of measured capacity to offer (default: %(default)s)")
    p.add_argument("--kill-every", type=float, default=120.0,
                   help="seconds between kill -9 of a random worker (default: %(default)s)")
    p.add_argument("--warmup-seconds", type=float, default=60.0,
                   help="memory growth is also measured from this point of the soak (default: %(default)s)")
    p.add_argument("--capacity-seconds", type=float, default=30.0, help="length of the capacity probe in seconds")
    p.add_argument("--capacity-concurrency", type=int, default=16, help="requests in flight in the capacity probe")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (default: %(default)s)")
    p.add_argument("--encode", type=int, default=2, help="encode workers (default: %(default)s)")
    p.add_argument("--llm", default="combined,combined,prefill,decode",
                   help="LLM worker roles (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="which workers get killed")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"))
    a = p.parse_args(argv)
    console = Console()
    spec = ClusterSpec(encode_workers=a.encode, llm_roles=[r for r in a.llm.split(",") if r], port=free_port(),
                       key_prefix="soak")
    with console.status("starting the cluster..."):
        cluster = LocalCluster(spec).start(timeout_s=300)
    supervising = Supervising(cluster)
    try:
        result = asyncio.run(soak(cluster, a, console))
    finally:
        supervising.close()
        result_reports = list(supervising.reports)
        cluster.stop()
    result["supervisor_reports"] = result_reports
    result = {"command": "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "python": platform.python_version()},
              "cluster": {"encode": a.encode, "llm": a.llm}, **result}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    o = result["outcomes"]
    console.print(f"sent {o['sent']}, served {o['served']}, errored {o['errored']}, wrong {o['wrong']}, "
                  f"lost {o['lost']}; re-run {o['rerun']}; kills {len(result['kills'])}")
    console.print(f"coordinator RSS growth: {result['coordinator_rss_growth_pct']}; Redis memory "
                  f"{result['redis_used_memory_mib']} MiB; written to {a.out}")
    return 0 if o["lost"] == 0 and o["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
