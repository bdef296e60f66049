"""benchmarks/overhead.py at two revisions, back to back: the per-request overhead before and after, as ratios.

Each revision is checked out in a git worktree of its own and overhead.py runs there (working directory and
PYTHONPATH the worktree, this interpreter), so the coordinator and every worker the launcher spawns (they
inherit both) import that revision's code (with --before-patch: plus that patch, e.g. a fix an old revision
needs to run with today's packages). Before measuring, a cluster started the same way is inspected with
`py-spy dump --full-filenames`: every project frame of every process must lie in the worktree. Rounds
alternate before/after, so drift on a shared machine falls on both sides. The worktrees are removed after.

    .venv/bin/pip install py-spy
    python -m benchmarks.overhead_before_after --before a875813 --after HEAD --concurrency 1 16 --requests 96 \
        --before-patch benchmarks/results/overhead_before_after.compat.patch
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench.report import write_json
from benchmarks.coordinator_profile import py_spy

PACKAGES = re.compile(r"\((/\S+/(?:coordinator|encode_node|llm_node|transport)/[^:]+):\d+\)")
"""A frame of the project's own code in `py-spy dump --full-filenames` output: its file."""
VERIFY = """
import subprocess, sys
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port
with LocalCluster(ClusterSpec(port=free_port(), key_prefix="before-after-check")) as c:
    for name, p in c.procs.items():
        out = subprocess.run([sys.argv[1], "dump", "--full-filenames", "--pid", str(p.pid)], capture_output=True,
                             text=True, timeout=60).stdout
        print("@@", name, p.pid, flush=True)
        print(out, flush=True)
"""
"""Run inside a worktree: start its cluster, dump every process's stacks (section per process after '@@')."""


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def tree_env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree))


def verify(tree: Path) -> dict[str, list[str]]:
    """Per process of a cluster started from `tree`: the project files on its stacks; raises if one is outside."""
    out = subprocess.run([sys.executable, "-c", VERIFY, py_spy()], cwd=tree, env=tree_env(tree), check=True,
                         capture_output=True, text=True, timeout=300).stdout
    files: dict[str, list[str]] = {}
    for section in out.split("@@ ")[1:]:
        name = section.split()[0]
        files[name] = sorted(set(PACKAGES.findall(section)))
    outside = {n: [f for f in fs if not f.startswith(f"{tree}/")] for n, fs in files.items()}
    if len(files) < 3 or not all(files.values()) or any(outside.values()):
        raise RuntimeError(f"{tree}: not every process runs this tree's code: {files}")
    return files


def measure(tree: Path, levels: list[str], requests: int, out: Path) -> dict:
    """One overhead.py run in `tree`: its levels, plus the machine's 1-minute load average before and after."""
    argv = ["-m", "benchmarks.overhead", "--concurrency", *levels, "--requests", str(requests), "--out", str(out)]
    load = os.getloadavg()[0]
    subprocess.run([sys.executable, *argv], cwd=tree, env=tree_env(tree), check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["levels"] | {"load_average_1min": [load, os.getloadavg()[0]]}


def summary(rounds: list[dict], side: str, levels: list[str]) -> dict:
    """Per level: the median over rounds of each round's overhead p50 and p90 (ms), and the rounds' values."""
    out = {}
    for c in levels:
        runs = [r[side][c] for r in rounds]
        out[c] = {q: statistics.median(x["overhead_ms"][q] for x in runs) for q in ("p50", "p90")} | {
            "compute_ms_mean": statistics.median(x["compute_ms_mean"] for x in runs),
            "e2e_ms_p50": statistics.median(x["e2e_ms"]["p50"] for x in runs),
            "rounds_p50": [x["overhead_ms"]["p50"] for x in runs], "rounds_p90": [x["overhead_ms"]["p90"] for x in runs]}
    return out


def markdown(report: dict) -> str:
    b, a = report["before"], report["after"]
    rows = ["| concurrency | before p50 | after p50 | after/before | per round | before p90 | after p90 | after/before "
            "| per round | compute mean before / after | e2e p50 before / after |", "| ---: |" + " ---: |" * 10]
    for c, r in report["ratios"].items():
        x, y, pr = b["summary"][c], a["summary"][c], report["paired_ratios"][c]
        rows.append(f"| {c} | {x['p50']:.1f} | {y['p50']:.1f} | {r['p50']:.2f} | {' '.join(f'{v:.2f}' for v in pr['p50'])} "
                    f"| {x['p90']:.1f} | {y['p90']:.1f} | {r['p90']:.2f} | {' '.join(f'{v:.2f}' for v in pr['p90'])} | "
                    f"{x['compute_ms_mean']:.1f} / {y['compute_ms_mean']:.1f} | {x['e2e_ms_p50']:.1f} / {y['e2e_ms_p50']:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead_before_after", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="a875813", help="revision (default: %(default)s)")
    p.add_argument("--after", default="HEAD", help="revision (default: %(default)s)")
    p.add_argument("--concurrency", nargs="+", default=["1", "16"])
    p.add_argument("--requests", type=int, default=96, help="requests per level and run (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="before/after pairs, alternating (default: %(default)s)")
    p.add_argument("--before-patch", type=Path, default=None,
                   help="a patch `git apply` puts on the before tree (a compatibility fix for today's packages)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead_before_after.json"))
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="overhead-ab-"))
    sides = {side: {"rev": rev, "sha": git("rev-parse", rev), "subject": git("log", "-1", "--format=%s", rev)[:100]}
             for side, rev in (("before", a.before), ("after", a.after))}
    trees = {side: work / f"wt-{side}" for side in sides}
    try:
        for side, tree in trees.items():
            git("worktree", "add", "--detach", str(tree), sides[side]["sha"])
            if side == "before" and a.before_patch:
                git("apply", str(a.before_patch.resolve()), cwd=tree)
                sides[side]["patch"] = {"file": str(a.before_patch), "diff": a.before_patch.read_text()}
            sides[side]["frames_checked"] = verify(tree)
        rounds = []
        for i in range(a.rounds):
            rounds.append({side: measure(trees[side], a.concurrency, a.requests, work / f"{side}-{i}.json")
                           for side in ("before", "after")})
            print(f"round {i + 1}: " + json.dumps({s: {c: round(r[c]["overhead_ms"]["p50"], 1) for c in a.concurrency}
                                                   for s, r in rounds[-1].items()}), flush=True)
    finally:
        for tree in trees.values():
            if tree.exists():
                git("worktree", "remove", "--force", str(tree))
    for side in sides:
        sides[side]["command"] = (f"cd {trees[side]} && PYTHONPATH={trees[side]} python -m benchmarks.overhead "
                                  f"--concurrency {' '.join(a.concurrency)} --requests {a.requests} --out ...")
        sides[side]["summary"] = summary(rounds, side, a.concurrency)
    report = {
        "command": "python -m benchmarks.overhead_before_after " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "benchmarks/overhead.py's per-request overhead (e2e minus encode/engine compute), two revisions, "
                "alternating rounds on one machine; summary = median over rounds of each run's p50 / p90; "
                "paired_ratios: after / before within each round",
        "machine": {"cpus": os.cpu_count()}, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "before": sides["before"], "after": sides["after"],
        "ratios": {c: {q: sides["after"]["summary"][c][q] / sides["before"]["summary"][c][q] for q in ("p50", "p90")}
                   for c in a.concurrency},
        "paired_ratios": {c: {q: [r["after"][c]["overhead_ms"][q] / r["before"][c]["overhead_ms"][q] for r in rounds]
                              for q in ("p50", "p90")} for c in a.concurrency},
        "rounds": rounds,
    }
    write_json(a.out, report)
    print(markdown(report))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
