"""Where the coordinator's CPU goes under load from null workers: py-spy samples, grouped by what they serve.

Brings up the same cluster as benchmarks/coordinator_capacity.py (null workers, text-only requests), runs
its closed-loop load generator at one concurrency, records the coordinator process with py-spy (every
thread; idle samples dropped), groups each sample by the first rule of GROUPS that one of its frames
matches, and prints a table of the share of the coordinator's CPU per group. With --before (an earlier
raw file) the table has both columns, which is how benchmarks/results/coordinator_profile.md was made.

    .venv/bin/pip install py-spy
    python -m benchmarks.coordinator_profile --concurrency 64 --raw /tmp/after.txt --before /tmp/before.txt
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.coordinator_capacity import warm
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port

IDLE = re.compile(r"^(Condition\.wait|Queue\.get|_worker \(concurrent|select|epoll|\w*Selector\.select"
                  r"|BaseSelectorEventLoop\._write_to_self)")
"""A thread parked on a lock or a queue (the thread pool between jobs), in or just out of epoll, or back from
waking the event loop and waiting for the GIL or its core: not its CPU. (Sampled with --gil, only the first two
ever show; sampling every thread, the last three are most of a busy worker's non-CPU samples.)"""
ROOT = re.compile(r"^(Runner\.run \(asyncio|Thread\.run \(threading)")
"""The frame every sample of the event loop (or of a pool thread) sits under; frames above it say nothing."""
GROUPS: list[tuple[str, re.Pattern]] = [(name, re.compile(p)) for name, p in [
    ("prompt: tokenizer call", r"PreTrainedTokenizerBase\.__call__|TokenizersBackend"),
    ("prompt: template, checks, pool copy", r"PromptBuilder\.build|TokenizerPool"),
    ("replies: TokenEvent JSON parse", r"parse_token_event"),
    ("replies: read, route to flights, trim", r"read_replies"),
    ("dispatch: registry scan (Redis + WorkerInfo parse)", r"WorkerRegistry\.(alive|scan)|alive_snapshot"),
    ("dispatch: job JSON + XADD", r"push_job|dispatch \(coordinator/submit"),
    ("request: body read, JSON + pydantic validation", r"_parse \(coordinator|_read_body|model_validate"),
    ("answer: JSON body (ChatCompletion)", r"_complete \(coordinator"),
    ("answer: SSE chunks", r"_sse \(coordinator|_chunk \(coordinator"),
    ("cleanup: abort publish, media DEL", r"_cleanup \(coordinator"),
    ("FastAPI dependencies (auth, query params)", r"solve_dependencies"),
    ("metrics, tracking", r"Tracker\.|prometheus_client"),
    ("chat handler: other", r"chat_completions \(coordinator"),
    ("background: failover, monitor, heartbeats", r"Failover|run_monitor|WorkloadMonitor|listen_channel"),
    ("Redis client: other", r"redis/"),
    ("HTTP server + ASGI stack (uvicorn, Starlette)", r"uvicorn|starlette|fastapi|Admission"),
]]
OTHER = "event loop, other"


def load(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format: frames root-first, ';'-separated, then a count."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            stack, _, n = line.rpartition(" ")
            out.append((stack.split(";"), int(n)))
    return out


def classify(frames: list[str], groups: list[tuple[str, re.Pattern]] = GROUPS, other: str = OTHER) -> str | None:
    """The group of one sample: the first whose pattern one of its frames matches; None for an idle thread."""
    if IDLE.match(frames[-1]):
        return None
    roots = [i for i, f in enumerate(frames) if ROOT.search(f)]
    frames = (frames[roots[-1] + 1:] or frames[-1:]) if roots else frames  # the root alone: a loop in C (uvloop)
    return next((g for g, rule in groups if any(rule.search(f) for f in frames)), other)


def breakdown(path: Path, groups: list[tuple[str, re.Pattern]] = GROUPS, other: str = OTHER) -> dict[str, float]:
    """Share of the non-idle samples per group (fractions summing to 1), plus "samples"."""
    counts: dict[str, int] = {}
    for frames, n in load(path):
        name = classify(frames, groups, other)
        if name is not None:
            counts[name] = counts.get(name, 0) + n
    total = sum(counts.values()) or 1
    return {name: counts.get(name, 0) / total for name, _ in [*groups, (other, None)]} | {"samples": total}


def py_spy() -> str:
    """The py-spy binary: on the PATH, else beside this interpreter (`.venv/bin/pip install py-spy`)."""
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit(f"py-spy is not installed (looked on the PATH and for {found}): "
                         f"{Path(sys.executable).parent / 'pip'} install py-spy")
    return found


def spy_record(pid: int, raw: Path, rate: int, gil: bool, seconds: float | None = None, threads: bool = False) -> list[str]:
    """py-spy's command line recording `pid` (every thread; raw format; never pausing it) into `raw`;
    without `seconds` it records until interrupted (SIGINT), then writes the file; with `threads` each sample's
    first frame is "thread (TID): name", TID the native thread id."""
    return [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), *(["--gil"] if gil else []),
            *(["--threads"] if threads else []),
            *(["--duration", str(int(seconds))] if seconds else []), "--format", "raw", "--nonblocking", "-o", str(raw)]


def markdown(after: dict[str, float], before: dict[str, float] | None) -> str:
    head = "| function group | % of coordinator CPU, before | after |\n| --- | ---: | ---: |" if before else \
        "| function group | % of coordinator CPU |\n| --- | ---: |"
    rows = []
    for name in [g for g, _ in GROUPS] + [OTHER]:
        if before:
            rows.append(f"| {name} | {100 * before[name]:.1f} | {100 * after[name]:.1f} |")
        else:
            rows.append(f"| {name} | {100 * after[name]:.1f} |")
    return "\n".join([head, *rows])


def record(concurrency: int, seconds: float, raw: Path, max_tokens: int) -> dict:
    """Profile the coordinator of a fresh null-worker cluster under load; the load generator's results."""
    spec = ClusterSpec(encode_workers=0, llm_roles=["combined"], port=free_port(), key_prefix="capacity-profile",
                       llm_args=["--engine", "null", "--max-num-seqs", "128"])
    with LocalCluster(spec, Path(tempfile.mkdtemp(prefix="profile-logs-"))) as cluster:
        warm(cluster.url)
        gen = subprocess.Popen([sys.executable, "-m", "benchmarks.capacity_load", "--port", str(spec.port),
                                "--concurrency", str(concurrency), "--window-s", str(seconds + 1),
                                "--max-tokens", str(max_tokens)], stdout=subprocess.PIPE, text=True)
        try:
            if gen.stdout.readline().strip() != "ready":
                raise RuntimeError("the load generator did not start")
            subprocess.run(spy_record(cluster.procs["coordinator"].pid, raw, 200, True, seconds),
                           check=True, capture_output=True, timeout=seconds + 60)
            gen.stdout.readline()
            result = json.loads(gen.stdout.readline())
        finally:
            if gen.poll() is None:
                gen.kill()
            gen.wait()
    result.pop("latencies_s")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.coordinator_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=8.0, help="how long py-spy records")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--raw", type=Path, required=True, help="where py-spy's raw samples go (or are, with --only-table)")
    p.add_argument("--before", type=Path, default=None, help="an earlier raw file to compare with")
    p.add_argument("--only-table", action="store_true", help="do not record: tabulate --raw as it is")
    a = p.parse_args(argv)
    if not a.only_table:
        result = record(a.concurrency, a.seconds, a.raw, a.max_tokens)
        print(f"load while recording: {result['ok'] / result['window_s']:.0f} req/s (py-spy's sampling included)")
    after = breakdown(a.raw)
    before = breakdown(a.before) if a.before else None
    print(markdown(after, before))
    print(f"\nsamples: {int(after['samples'])}" + (f" (before: {int(before['samples'])})" if before else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
