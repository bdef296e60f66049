"""Where every process of a local cluster spends its CPU, under light and heavy load: py-spy on each of them.

Brings up the cluster `tierserve bench --target local` starts (1 encode worker and 1 combined LLM worker, each
pinned to a core of its own as the bench emulates one device per core; the coordinator and a private Redis
float), sends the image+text requests of benchmarks/overhead.py at each concurrency (1: light, 16: heavy), and
while they run records the coordinator and every worker with py-spy (every thread, idle ones dropped, never
pausing the process; the coordinator only while a thread holds the GIL, see GIL_NOTE) and reads the CPU time of each process and of each of its threads from /proc. Each sample
goes to the first of CATEGORIES one of its frames matches (benchmarks/coordinator_profile.py's classify); each
thread's CPU is shared out over the categories of its own samples, so the table is CPU, not sample counts (a
thread waiting for the GIL or for its core is still sampled, and would otherwise count as busy).

    .venv/bin/pip install py-spy
    python -m benchmarks.process_profile --concurrency 1 16 --requests 150 400

Other layouts: `--llm decode --local-prefill --offload-share 1` (encode and a prefill worker on core 0, a decode
worker on core 1), `--max-num-seqs N` (each LLM worker's step size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from rich.console import Console
from rich.progress import Progress

from benchmarks.bench.report import write_json
from benchmarks.coordinator_profile import classify, load, spy_record
from benchmarks.overhead import run_level, summarize
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port

OTHER = "event loop (asyncio), other Python"
CATEGORIES: list[tuple[str, re.Pattern]] = [(name, re.compile(p)) for name, p in [
    ("model compute (torch forward)", r"torch/nn/modules|get_image_features|ModelRunner\.(prefill|decode|embed)"),
    ("engine: schedule, sample, update", r"ReferenceEngine|Scheduler\.|llm_node/(sampling|sequence|kv|preemption)"),
    ("media: base64, checks, image decode, preprocessing",
     r"load_media|load_image|check_image_bytes|decode_base64|decode_image|decode_each|image_process|PIL/"),
    ("tokenizer: prompt template + tokenize, detokenize",
     r"PromptBuilder|TokenizerPool|PreTrainedTokenizer|TokenizersBackend|tokenization_utils|jinja2|[Dd]etokeniz"),
    ("transport (embeddings send / receive)", r"transport/|deliver \(coordinator"),
    ("serialization (pydantic, JSON)", r"pydantic/|json/|model_dump|model_validate|model_copy|parse_token_event"),
    ("Redis I/O (redis-py)", r"redis/"),
    ("logging, metrics", r"logging/|prometheus_client|Tracker\."),
    ("HTTP server + ASGI (uvicorn, Starlette, FastAPI)", r"uvicorn|starlette|fastapi|h11/|httptools"),
    ("event loop in C (uvloop: poll, I/O, callbacks)", r"^Runner\.run \(asyncio"),
]]
"""First match wins, so the order matters: the forward before what calls it, media before the prompt builder
that loads it, the wire format before the Redis call it feeds; the HTTP stack last (every handler runs under it)."""
GIL_NOTE = ("the coordinator is sampled with --gil (only the thread holding the GIL): uvloop waits in C with the GIL "
            "released, and sampled without it 39% of its samples were such waits (leaf Runner.run) against 3% with it; "
            "workers are sampled without --gil, as their forward runs in torch's C++ with the GIL released")
"""Why the coordinator alone is sampled with --gil (measured side by side on one run at concurrency 16)."""
NATIVE = "threads with no Python stack sampled, exited threads"
THREAD = re.compile(r"^thread \((\d+)\)")
"""The first frame of a sample recorded with --threads: the native thread id."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None, system_only: bool = False) -> float:
    """User + system CPU so far of process `pid` (every thread), or of its thread `tid` (/proc stat fields 14, 15);
    with `system_only`, the time in the kernel alone (syscalls: socket reads and writes, futexes, epoll)."""
    fields = Path(f"/proc/{pid}" + (f"/task/{tid}" if tid else "") + "/stat").read_text().rpartition(")")[2].split()
    return (int(fields[12]) + (0 if system_only else int(fields[11]))) / CLK_TCK


def redis_commands(url: str, reset: bool = False) -> dict[str, int]:
    """Calls per command the cluster's Redis has served since its last reset (INFO commandstats)."""
    client = redis.Redis.from_url(url)
    try:
        if reset:
            client.config_resetstat()
        return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}
    finally:
        client.close()


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU so far of each live thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that just exited
            out[int(task.name)] = cpu_seconds(pid, int(task.name))
    return out


def attribute(raw: Path, cpu_by_thread: dict[int, float], total_cpu: float) -> tuple[dict[str, float], int]:
    """Each thread's CPU shared out over the categories of its own busy samples (so a thread waiting for the GIL
    or its core, which py-spy still samples, takes no CPU from the one running); CPU of a thread with no busy
    sample goes to OTHER if py-spy saw it, to NATIVE if not, as does CPU of threads that exited meanwhile."""
    counts: dict[int, dict[str, int]] = {}
    seen: set[int] = set()
    for frames, n in load(raw):
        tid = int(THREAD.match(frames[0])[1])
        seen.add(tid)
        name = classify(frames[1:], CATEGORIES, OTHER) if len(frames) > 1 else NATIVE
        if name is not None:
            counts.setdefault(tid, {}).setdefault(name, 0)
            counts[tid][name] += n
    out = dict.fromkeys([c for c, _ in CATEGORIES] + [OTHER, NATIVE], 0.0)
    for tid, cpu in cpu_by_thread.items():
        mine = counts.get(tid) or {OTHER if tid in seen else NATIVE: 1}
        for name, n in mine.items():
            out[name] += cpu * n / sum(mine.values())
    out[NATIVE] += max(0.0, total_cpu - sum(cpu_by_thread.values()))
    return out, sum(sum(c.values()) for c in counts.values())


def profile_level(cluster: LocalCluster, concurrency: int, requests: int, max_tokens: int, rate: int,
                  raw_dir: Path, progress: Progress) -> dict:
    """One load level: py-spy on every cluster process for exactly the time the requests take."""
    pids = {name: p.pid for name, p in cluster.procs.items()}
    raws = {name: raw_dir / f"c{concurrency}-{name}.txt" for name in pids}
    spies = {name: subprocess.Popen(spy_record(pid, raws[name], rate, gil=name == "coordinator", threads=True),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in pids.items()}
    try:
        time.sleep(1.0)  # attached before the first request
        watched = pids | ({"redis-server": cluster.redis.proc.pid} if cluster.redis else {}) | \
            {f"py-spy {name}": s.pid for name, s in spies.items()}
        load0, _ = os.getloadavg()[0], redis_commands(cluster.redis_url, reset=True)
        sys0 = {n: cpu_seconds(p, system_only=True) for n, p in pids.items()}
        threads0 = {name: thread_cpu(pid) for name, pid in pids.items()}
        cpu0, self0, t0 = {n: cpu_seconds(p) for n, p in watched.items()}, time.process_time(), time.perf_counter()
        rows = asyncio.run(run_level(cluster.url, concurrency, requests, max_tokens, progress))
        wall = time.perf_counter() - t0
        cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in watched.items()} | {"load generator": time.process_time() - self0}
        threads = {name: {t: c - threads0[name].get(t, 0.0) for t, c in thread_cpu(pid).items()} for name, pid in pids.items()}
        load1, commands = os.getloadavg()[0], redis_commands(cluster.redis_url)
        system = {n: cpu_seconds(p, system_only=True) - sys0[n] for n, p in pids.items()}
    finally:
        for s in spies.values():
            s.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        errors = {name: s.communicate(timeout=60)[1].decode(errors="replace")[-400:] for name, s in spies.items()}
    processes = {}
    for name in pids:
        if not raws[name].exists():
            raise RuntimeError(f"py-spy wrote nothing for {name}: {errors[name]}")
        by_cat, samples = attribute(raws[name], threads[name], cpu[name])
        processes[name] = {"cpu_s": cpu[name], "cores": cpu[name] / wall, "cpu_ms_per_request": cpu[name] / requests * 1e3,
                           "system_share": system[name] / (cpu[name] or 1),
                           "busy_samples": samples, "share": {c: v / (cpu[name] or 1) for c, v in by_cat.items()},
                           "cpu_ms_per_request_by_category": {c: v / requests * 1e3 for c, v in by_cat.items()},
                           "threads_cpu_s": {str(t): c for t, c in sorted(threads[name].items(), key=lambda x: -x[1]) if c}}
    return {"concurrency": concurrency, "requests": requests, "wall_s": wall, "req_per_s": requests / wall,
            "load_average_1min": [load0, load1], "cpu_s_all": cpu,
            "redis_commands_per_request": {c: n / requests for c, n in sorted(commands.items(), key=lambda x: -x[1])}, "processes": processes, "overhead": summarize(rows)}


def markdown(levels: list[dict]) -> str:
    """Two tables: CPU per process, then each process's CPU per request by category (ms, and % of it)."""
    names = list(levels[0]["processes"])
    cols = [(n, lv) for n in names for lv in levels]
    head = " | ".join(f"{n} c={lv['concurrency']}" for n, lv in cols)
    out = ["| process | " + " | ".join(f"c={lv['concurrency']} cores | c={lv['concurrency']} CPU ms/req"
                                       for lv in levels) + " |",
           "| --- |" + " ---: | ---: |" * len(levels)]
    for proc in levels[0]["cpu_s_all"]:
        out.append(f"| {proc} | " + " | ".join(f"{lv['cpu_s_all'][proc] / lv['wall_s']:.2f} | "
                                               f"{lv['cpu_s_all'][proc] / lv['requests'] * 1e3:.1f}" for lv in levels) + " |")
    out += ["", f"| category (CPU ms/request, % of the process) | {head} |", "| --- |" + " ---: |" * len(cols)]
    for cat in [c for c, _ in CATEGORIES] + [OTHER, NATIVE]:
        cells = []
        for n, lv in cols:
            p = lv["processes"][n]
            cells.append(f"{p['cpu_ms_per_request_by_category'][cat]:.2f} ({100 * p['share'][cat]:.0f}%)"
                         if p["share"][cat] >= 0.005 else "-")
        out.append(f"| {cat} | " + " | ".join(cells) + " |")
    out.append("| **total CPU ms/request** | " + " | ".join(
        f"**{lv['processes'][n]['cpu_ms_per_request']:.1f}**" for n, lv in cols) + " |")
    out.append("| of which in the kernel (system time) | " + " | ".join(
        f"{lv['processes'][n]['system_share']:.0%}" for n, lv in cols) + " |")
    out.append("| idle (1 - cores used) | " + " | ".join(
        f"{max(0.0, 1 - lv['processes'][n]['cores']):.0%}" for n, lv in cols) + " |")
    out.append("| py-spy busy samples | " + " | ".join(str(lv["processes"][n]["busy_samples"]) for n, lv in cols) + " |")
    out += ["", "| Redis commands per request (the whole cluster) | " + " | ".join(f"c={lv['concurrency']}" for lv in levels)
            + " |", "| --- |" + " ---: |" * len(levels)]
    for cmd in dict.fromkeys(c for lv in levels for c in lv["redis_commands_per_request"]):  # by calls, first level first
        out.append(f"| {cmd} | " + " | ".join(f"{lv['redis_commands_per_request'].get(cmd, 0):.2f}" for lv in levels) + " |")
    out.append("| **all** | " + " | ".join(f"**{sum(lv['redis_commands_per_request'].values()):.1f}**" for lv in levels) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.process_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="load levels (default: %(default)s)")
    p.add_argument("--requests", type=int, nargs="+", default=[150, 400], help="requests per level, one per --concurrency")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default: %(default)s)")
    p.add_argument("--no-pin", action="store_true", help="let the workers float over every core")
    p.add_argument("--llm", default="combined", help="LLM worker roles, as tierserve up --llm (default: %(default)s)")
    p.add_argument("--local-prefill", action="store_true",
                   help="a prefill worker beside the encode worker, on its core (tierserve up --local-prefill)")
    p.add_argument("--offload-share", type=float, default=0.0,
                   help="s: share of prefills on the local prefill worker (default: %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="each LLM worker's --max-num-seqs (default: the worker's own)")
    p.add_argument("--raw-dir", type=Path, default=None, help="keep py-spy's raw files here (default: a temp dir)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/process_profile.json"))
    a = p.parse_args(argv)
    if len(a.requests) != len(a.concurrency) or min(a.requests + a.concurrency) < 1:
        p.error("give one --requests count (>= 1) per --concurrency level (>= 1)")
    raw_dir = a.raw_dir or Path(tempfile.mkdtemp(prefix="process-profile-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    if a.max_num_seqs is not None and a.max_num_seqs < 1:
        p.error("--max-num-seqs must be >= 1")
    if a.offload_share and not a.local_prefill:
        p.error("--offload-share needs --local-prefill (the worker the share goes to)")
    spec = ClusterSpec(encode_workers=1, llm_roles=a.llm.split(","), pin_cores=not a.no_pin, port=free_port(),
                       key_prefix="process-profile", local_prefill=a.local_prefill,
                       coordinator_args=["--offload-share", str(a.offload_share)],
                       llm_args=["--max-num-seqs", str(a.max_num_seqs)] if a.max_num_seqs else [])
    levels = []
    with LocalCluster(spec) as cluster, Progress(console=Console(stderr=True)) as progress:
        asyncio.run(run_level(cluster.url, 2, 4, a.max_tokens, progress))  # warm-up, not profiled
        for c, n in zip(a.concurrency, a.requests):
            levels.append(profile_level(cluster, c, n, a.max_tokens, a.rate, raw_dir, progress))
    report = {
        "command": "python -m benchmarks.process_profile " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "per process: CPU (/proc, per thread) over the load window, each thread's shared out over the "
                "categories of its busy py-spy samples",
        "cluster": {"encode": 1, "llm": a.llm, "local_prefill": a.local_prefill, "offload_share": a.offload_share,
                    "max_num_seqs": a.max_num_seqs, "model": "tiny-llava", "max_tokens": a.max_tokens,
                    "pin_cores": not a.no_pin, "threads": spec.threads},
        "py_spy": {"rate_hz": a.rate, "flags": "--nonblocking --threads, idle threads dropped", "gil": GIL_NOTE,
                   "raw_dir": str(raw_dir)},
        "machine": {"cpus": os.cpu_count()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "categories": {name: rule.pattern for name, rule in CATEGORIES} | {OTHER: "none of the above"},
        "levels": levels,
    }
    write_json(a.out, report)
    print(markdown(levels))
    print(f"\nwrote {a.out}; raw samples in {raw_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
