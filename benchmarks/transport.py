"""Transport backends against the physical limits, side by side in one run.

For each size (64 KB, 1 MB, 4.5 MB = one image embedding, 32 MB = a KV block) every lane moves the bytes
to its own child process, one transfer at a time, and the lanes take turns transfer by transfer, so on a
machine shared with other work they all see the same load. A backend's time is its full path: `send()`,
then its child's `recv()` with the returned descriptors (which checks the CRC32 for ucx and nixl), as a
worker does; both are also reported alone. The limits are measured the same way: single-copy shared memory (copy into a mapped /dev/shm
segment, one-byte pipe ping-pong) on one host, and raw TCP (`sendall`, `recv_into` a pre-allocated
buffer, one-byte reply) for the network path, where ucx and nixl run with UCX_TLS=tcp. Rows
"[checksum=none]" leave the CRC32 out, "ucx[sm]" lets UCX use its shared-memory transports (unsafe, see
transport/README.md), rows "<lib>-dataplane" are the library alone (transport/dataplane.py): together
they say where the time goes. `--repeat N` runs it all N times and reports the
spread of each share. JSON out, with the command and the machine's load.

    python -m benchmarks.transport --sizes 64K 1M 4.5M 32M --backends local tcp ucx nixl --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from benchmarks.stats import percentile
from benchmarks.transport_lanes import (
    BackendLane,
    DataplaneLane,
    HostedLane,
    Lane,
    LaneHost,
    RawTcpLane,
    ShmLane,
)
from transport.checksum import FAST
from transport.registry import unavailable

ROOT = Path(__file__).resolve().parents[1]
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
TARGET = 0.8
VERDICT_SIZE = 4718592
WARMUP = 3
TCP = {"UCX_TLS": "tcp"}
SM = {"UCX_TLS": "self,sm,tcp"}


def parse_size(text: str) -> int:
    unit = UNITS.get(text[-1].upper(), 1)
    return int(float(text[:-1] if text[-1].upper() in UNITS else text) * unit)


def iters_for(size: int, budget: int) -> int:
    return max(5, min(200, budget // max(size, 1)))


def family(lane: str) -> str | None:
    """The UCX library a lane loads (ucx: ucxx, nixl: NIXL's own), or None."""
    return next((lib for lib in ("ucx", "nixl") if lane.startswith(lib)), None)


def lane_factories(kinds: list[str], sizes: list[int]) -> dict[str, Callable[[], Lane]]:
    """The limits, every available backend on its paths, and what explains their gap to the limit;
    each lane starts its child process when made."""
    top = max(sizes)
    lanes: dict[str, Callable[[], Lane]] = {"limit:shm": lambda: ShmLane(sizes), "limit:rawtcp": RawTcpLane}
    if "local" in kinds:
        lanes["local:host"] = lambda: BackendLane("local:host", "host", "local")
    if "tcp" in kinds:
        lanes["tcp:tcp"] = lambda: BackendLane("tcp:tcp", "tcp", "tcp")
    if "ucx" in kinds:  # [sm]: UCX's shared-memory transports (cma, posix), fast but unsafe when a peer dies (README)
        lanes |= {"ucx:host": lambda: BackendLane("ucx:host", "host", "ucx"),
                  "ucx[checksum=none]:host": lambda: BackendLane("ucx[checksum=none]:host", "host", "ucx",
                                                                 checksum="none"),
                  "ucx[sm]:host": lambda: BackendLane("ucx[sm]:host", "host", "ucx", SM,
                                                      options={"TLS": SM["UCX_TLS"]}),
                  "ucx-dataplane:host": lambda: DataplaneLane("ucx-dataplane:host", "host", "ucx", top),
                  "ucx:tcp": lambda: BackendLane("ucx:tcp", "tcp", "ucx", TCP, options={"TLS": "tcp"}),
                  "ucx-dataplane:tcp": lambda: DataplaneLane("ucx-dataplane:tcp", "tcp", "ucx", top, TCP)}
    if "nixl" in kinds:
        lanes |= {"nixl:host": lambda: BackendLane("nixl:host", "host", "nixl"),
                  "nixl[checksum=none]:host": lambda: BackendLane("nixl[checksum=none]:host", "host", "nixl",
                                                                  checksum="none"),
                  "nixl-dataplane:host": lambda: DataplaneLane("nixl-dataplane:host", "host", "nixl", top),
                  "nixl:tcp": lambda: BackendLane("nixl:tcp", "tcp", "nixl", TCP),
                  "nixl-dataplane:tcp": lambda: DataplaneLane("nixl-dataplane:tcp", "tcp", "nixl", top, TCP)}
    return lanes


def make_lanes(kinds: list[str], sizes: list[int], names: list[str]) -> list[Lane]:
    """The named lanes, made in this process (a LaneHost makes its library's lanes with this)."""
    factories = lane_factories(kinds, sizes)
    return [factories[n]() for n in names]


def select_lanes(kinds: list[str], sizes: list[int], only: list[str] | None = None) -> list[Lane]:
    """The limits and `only` (default: every lane), with each UCX library's lanes sending from a process
    of their own (LaneHost says why)."""
    known = list(lane_factories(kinds, sizes))
    unknown = set(only or []) - set(known)
    if unknown:
        raise SystemExit(f"unknown lanes {sorted(unknown)}; known: {sorted(known)}")
    names = [n for n in known if not only or n in only or n.startswith("limit:")]
    hosts = {lib: LaneHost(kinds, sizes, [n for n in names if family(n) == lib])
             for lib in {family(n) for n in names} - {None}}
    here = dict(zip((n for n in names if family(n) is None),
                    make_lanes(kinds, sizes, [n for n in names if family(n) is None]), strict=True))
    return [HostedLane(hosts[family(n)], n) if family(n) else here[n] for n in names]


async def run_once(lanes: list[Lane], sizes: list[int], budget: int, rep: int, tick) -> dict[str, dict]:
    """{lane: {"send": {size: [s]}, "recv": {size: [s]}}}; "recv" is the child's claim, for backends."""
    times = {lane.name: {"send": {s: [] for s in sizes}, "recv": {s: [] for s in sizes}} for lane in lanes}
    for size in sizes:
        for i in range(iters_for(size, budget) + WARMUP):
            turn = (i + rep) % len(lanes)  # rotate who goes first, so no lane always follows the same one
            for lane in lanes[turn:] + lanes[:turn]:
                took = await lane.once(size, rep * 100_000 + i)
                claim = getattr(lane, "last_recv_s", None)
                if i >= WARMUP:
                    times[lane.name]["send"][size].append(took)
                    if claim is not None:
                        times[lane.name]["recv"][size].append(claim)
                tick()
    return times


def summarize(times: dict[str, dict[int, list[float]]]) -> dict[str, dict]:
    """Per size: the full path (send() then the child's recv(), each transfer's sum; send() alone for the
    limits and data planes), and send() and recv() on their own."""
    rows = {}
    for size, sends in times["send"].items():
        claims = times["recv"][size]
        path = [s + r for s, r in zip(sends, claims, strict=True)] if claims else sends
        p50 = percentile(path, 0.5)
        rows[str(size)] = {"iters": len(path), "p50_ms": p50 * 1e3, "p99_ms": percentile(path, 0.99) * 1e3,
                           "gbps": size / p50 / 1e9}
        if claims:
            rows[str(size)] |= {"send_p50_ms": percentile(sends, 0.5) * 1e3, "recv_p50_ms": percentile(claims, 0.5) * 1e3}
    return rows


def limit_of(lane: str) -> str:
    return "limit:shm" if lane.rsplit(":", 1)[1] == "host" else "limit:rawtcp"


def shares(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each lane's throughput as a share of its path's limit, per size (1.0 = as fast as the limit)."""
    return {name: {s: rows[s]["gbps"] / results[limit_of(name)][s]["gbps"] for s in rows}
            for name, rows in results.items() if not name.startswith("limit:")}


async def run(a: argparse.Namespace, console: Console) -> dict:
    sizes, budget = a.sizes, a.budget
    kinds = [k for k in a.backends if not unavailable(k)]
    skipped = {k: unavailable(k) for k in a.backends if unavailable(k)}
    lanes = select_lanes(kinds, sizes, a.lanes)
    runs: list[dict] = []
    try:
        await asyncio.gather(*(lane.open(sizes) for lane in lanes))
        steps = a.repeat * len(lanes) * sum(iters_for(s, budget) + WARMUP for s in sizes)
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("transfers", total=steps)
            for rep in range(a.repeat):
                load = [os.getloadavg()[0]]
                times = await run_once(lanes, sizes, budget, rep, lambda: progress.advance(bar))
                load.append(os.getloadavg()[0])
                results = {lane.name: summarize(times[lane.name]) for lane in lanes}
                runs.append({"load_average_1min": load, "results": results, "shares": shares(results)})
    finally:
        await asyncio.gather(*(lane.close() for lane in lanes), return_exceptions=True)
    key = str(VERDICT_SIZE) if VERDICT_SIZE in sizes else str(sizes[-1])
    spread = {name: {s: {"min": min(v), "median": statistics.median(v), "max": max(v)}
                     for s in per if (v := [r["shares"][name][s] for r in runs])}
              for name, per in runs[-1]["shares"].items()}
    verdicts = {}
    for name, per in spread.items():
        share, limit = per[key], limit_of(name).split(":")[1]
        verdicts[name] = (f"{name} at {int(key) / 2**20:.1f} MB: {share['median']:.0%} of {limit} "
                          f"(runs: {share['min']:.0%}-{share['max']:.0%}); "
                          f"target {TARGET:.0%}: {'met' if share['median'] >= TARGET else 'NOT met'}")
    return {"results": runs[-1]["results"], "runs": runs, "share_spread": spread, "verdicts": verdicts,
            "skipped": skipped}


def table(report: dict) -> Table:
    results, spread = report["results"], report["share_spread"]
    sizes = list(next(iter(results.values())))
    t = Table(title="transport: full-path p50 ms (last run) / share of the limit (median of runs)")
    t.add_column("lane")
    for s in sizes:
        t.add_column(f"{int(s) / 2**20:.3g} MB", justify="right")
    for name, rows in results.items():
        share = spread.get(name)
        t.add_row(escape(name), *(f"{rows[s]['p50_ms']:.3f}" + (f" / {share[s]['median']:.0%}" if share else "")
                          for s in sizes))
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.transport", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[65536, 1 << 20, VERDICT_SIZE, 32 << 20],
                   help="message sizes, e.g. 64K 1M 4.5M 32M")
    p.add_argument("--backends", nargs="+", default=["local", "tcp", "ucx", "nixl"], help="backends to measure")
    p.add_argument("--budget", type=parse_size, default=parse_size("200M"),
                   help="bytes per size and lane (iterations = budget / size, 5..200)")
    p.add_argument("--repeat", type=int, default=3, help="whole runs, for the spread of each share")
    p.add_argument("--lanes", nargs="+", help="run only these lanes (and the limits), e.g. nixl:host ucx:tcp")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/transport.json")
    a = p.parse_args(argv)
    console = Console()
    report = asyncio.run(run(a, console))
    report = {"command": "python -m benchmarks.transport " + " ".join(argv), "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "fast_crc32": FAST, "load_average_1min": [r["load_average_1min"] for r in report["runs"]],
        "note": "lanes interleaved transfer by transfer; shares are side by side within a run"}, **report}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    console.print(table(report))
    for line in report["verdicts"].values():
        console.print(escape(line))
    for kind, why in report["skipped"].items():
        console.print(f"[yellow]skipped {kind}: {why}")
    console.print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
