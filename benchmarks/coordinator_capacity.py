"""The coordinator's own capacity: requests/s it admits and relays when the workers answer instantly.

Brings up a local cluster whose LLM workers run `--engine null` (real worker processes, no model: one token
per request per engine step; llm_node/null_engine.py), sends text-only chat requests from a load generator
in a process of its own (benchmarks/capacity_load.py, a closed loop over raw keep-alive HTTP/1.1) at
increasing concurrency, and measures, per level, over a fixed window:

- requests/s answered 200 (admitted and relayed), 429s apart, and that none was lost (every request sent
  is answered once the window closes);
- p50 / p99 latency at the client;
- CPU seconds (utime + stime from /proc/<pid>/stat) of the coordinator process per request and per output
  token, and the CPU use of the load generator, the workers and Redis, in cores: on a small machine they
  share the cores with the coordinator, and the table shows whether the coordinator or the rest was the limit.

Writes JSON with the command line to benchmarks/results/coordinator_capacity.json and prints a table.

    python -m benchmarks.coordinator_capacity --workers 1 2 --concurrency 1 8 32 64 --window-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.stats import percentile
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port

RESULTS = Path(__file__).parent / "results" / "coordinator_capacity.json"
TICKS_S = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_S


def pids(cluster: LocalCluster) -> dict[str, list[int]]:
    """The processes whose CPU is reported, by part."""
    out = {"coordinator": [cluster.procs["coordinator"].pid],
           "workers": [p.pid for name, p in cluster.procs.items() if name.startswith("llm-")], "redis": []}
    if cluster.redis is not None and cluster.redis.proc is not None:
        out["redis"] = [cluster.redis.proc.pid]
    return out


def cpu_snapshot(parts: dict[str, list[int]]) -> dict[str, float]:
    return {part: sum(proc_cpu_s(pid) for pid in ps) for part, ps in parts.items()}


def run_level(cluster: LocalCluster, concurrency: int, max_tokens: int, a: argparse.Namespace) -> dict:
    """One closed-loop window at `concurrency`; the measured figures of the coordinator and the rest."""
    argv = [sys.executable, "-m", "benchmarks.capacity_load", "--port", str(cluster.spec.port),
            "--concurrency", str(concurrency), "--window-s", str(a.window_s), "--warmup-s", str(a.warmup_s),
            "--max-tokens", str(max_tokens), *(["--stream"] if a.stream else [])]
    parts = pids(cluster)
    gen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if gen.stdout.readline().strip() != "ready":
            raise RuntimeError(f"load generator failed: {gen.stderr.read()[-2000:]}")
        before, t0 = cpu_snapshot(parts), time.perf_counter()
        if gen.stdout.readline().strip() != "end":
            raise RuntimeError(f"load generator failed: {gen.stderr.read()[-2000:]}")
        after, wall = cpu_snapshot(parts), time.perf_counter() - t0
        result = json.loads(gen.stdout.readline())
        gen.wait(30)
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
    lat = result.pop("latencies_s")
    ok, tokens, window = result["ok"], result["tokens"], result["window_s"]
    cpu = {part: after[part] - before[part] for part in parts}
    coord = cpu["coordinator"]
    return {
        "workers": len(parts["workers"]), "concurrency": concurrency, "max_tokens": max_tokens, "stream": a.stream,
        "req_s": ok / window, "tokens_s": tokens / window, "ok": ok, "rejected_429": result["rejected_429"],
        "lost": sum(result["failed"].values()), "failed": result["failed"],
        "p50_ms": 1000 * (percentile(lat, 0.5) or 0), "p99_ms": 1000 * (percentile(lat, 0.99) or 0),
        "coordinator_cpu_ms_per_req": 1000 * coord / ok if ok else None,
        "coordinator_cpu_us_per_token": 1e6 * coord / tokens if tokens else None,
        "cores_used": {part: v / wall for part, v in cpu.items()} | {"loadgen": result["loadgen_cpu_s"] / window},
        "window_s": window,
    }


def warm(url: str, n: int = 20) -> None:
    body = {"model": "tiny-llava", "max_tokens": 2, "messages": [{"role": "user", "content": "warm up"}]}
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            client.post(f"{url}/v1/chat/completions", json=body).raise_for_status()


def sweep(a: argparse.Namespace, console: Console) -> list[dict]:
    rows = []
    with Progress(console=console) as progress:
        task = progress.add_task("levels", total=len(a.workers) * len(a.concurrency) * len(a.max_tokens))
        for workers in a.workers:
            spec = ClusterSpec(encode_workers=0, llm_roles=["combined"] * workers, port=free_port(),
                               key_prefix=f"capacity-{os.getpid()}", redis_url=a.redis_url,
                               llm_args=["--engine", "null", "--max-num-seqs", str(a.max_num_seqs)],
                               coordinator_args=["--max-in-flight", str(a.max_in_flight)])
            with LocalCluster(spec, Path(tempfile.mkdtemp(prefix="capacity-logs-"))) as cluster:
                warm(cluster.url)
                for c in a.concurrency:
                    for n in a.max_tokens:
                        progress.update(task, description=f"{workers} worker(s), concurrency {c}, {n} tokens")
                        row = run_level(cluster, c, n, a)
                        rows.append(row)
                        progress.advance(task)
                        console.log(f"{workers} worker(s) c={c} max_tokens={n}: {row['req_s']:.0f} req/s, "
                                    f"coordinator {row['cores_used']['coordinator']:.2f} cores")
    return rows


def cpu_fit(rows: list[dict]) -> list[dict]:
    """Per (workers, concurrency) run at several max_tokens: the coordinator's CPU per request as
    fixed_ms + per_token_us * tokens per request (least squares), separating the cost of a request from
    the cost of relaying each token."""
    fits = []
    for key in sorted({(r["workers"], r["concurrency"]) for r in rows}):
        pts = [(r["tokens_s"] / r["req_s"], r["coordinator_cpu_ms_per_req"]) for r in rows
               if (r["workers"], r["concurrency"]) == key and r["ok"]]
        if len({round(x, 6) for x, _ in pts}) < 2:
            continue
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        fits.append({"workers": key[0], "concurrency": key[1], "fixed_ms_per_req": my - slope * mx,
                     "per_token_us": 1000 * slope, "points": len(pts)})
    return fits


def table(rows: list[dict]) -> Table:
    t = Table(title="Coordinator capacity with null workers (closed loop; CPU in cores used over the window)")
    for col in ("workers", "conc", "tokens", "req/s", "tok/s", "429", "lost", "p50 ms", "p99 ms", "coord CPU ms/req",
                "coord CPU us/tok", "coord", "loadgen", "workers", "redis"):
        t.add_column(col, justify="right")
    for r in rows:
        u = r["cores_used"]
        t.add_row(str(r["workers"]), str(r["concurrency"]), str(r["max_tokens"]), f"{r['req_s']:.0f}", f"{r['tokens_s']:.0f}",
                  str(r["rejected_429"]), str(r["lost"]), f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                  f"{r['coordinator_cpu_ms_per_req'] or 0:.2f}", f"{r['coordinator_cpu_us_per_token'] or 0:.0f}",
                  f"{u['coordinator']:.2f}", f"{u['loadgen']:.2f}", f"{u['workers']:.2f}", f"{u['redis']:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.coordinator_capacity",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="null LLM workers per cluster")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64], help="connections of the loop")
    p.add_argument("--window-s", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup-s", type=float, default=1.0, help="load before each window, not measured")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[8],
                   help="completion tokens per request; two or more values also fit the coordinator's CPU per "
                        "request as fixed + per-token cost")
    p.add_argument("--stream", action="store_true", help="SSE answers (stream: true) instead of JSON")
    p.add_argument("--max-num-seqs", type=int, default=128, help="each null worker's step size")
    p.add_argument("--max-in-flight", type=int, default=256, help="the coordinator's admission limit")
    p.add_argument("--redis-url", default=None, help="default: a private redis-server for the run")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    if min(a.workers) < 1 or min(a.concurrency) < 1 or min(a.max_tokens) < 1 or a.window_s <= 0:
        p.error("--workers, --concurrency and --max-tokens must be >= 1 and --window-s > 0")
    console = Console(width=max(160, Console().width))
    rows = sweep(a, console)
    console.print(table(rows))
    best = max(rows, key=lambda r: r["req_s"])
    out = {"command": " ".join(["python -m benchmarks.coordinator_capacity", *(argv or sys.argv[1:])]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
           "note": "Every process (coordinator, null workers, Redis, load generator) shares this machine's cores; "
                   "cores_used says how much each took. Closed loop: req_s at a level is what that many "
                   "connections got, not an open-loop arrival rate.",
           "best": {k: best[k] for k in ("workers", "concurrency", "req_s", "p50_ms", "p99_ms",
                                         "coordinator_cpu_ms_per_req", "coordinator_cpu_us_per_token")},
           "cpu_fit": cpu_fit(rows), "levels": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"best: {best['req_s']:.0f} req/s ({best['workers']} worker(s), concurrency {best['concurrency']});"
                  f" wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
