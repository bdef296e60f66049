"""Transport backends against the physical limits, side by side in one run.

For each size (64 KB, 1 MB, 4.5 MB = one image embedding, 32 MB = a KV block) a sender in this process
sends to a receiver in a child process, one send at a time; the latency is that of `send()`, which
returns once the receiver verified the bytes (CRC32), and the receiver claims every tensor with `recv()`.
Two limits are measured the same way: single-copy shared memory (copy into a /dev/shm segment, one-byte
pipe ping-pong) on one host, and raw TCP (`sock_recv_into` into a pre-allocated buffer, one-byte reply)
on the network path. The network pass runs ucx and nixl with UCX_TLS=tcp; a host-cma pass runs ucx with
cross-memory attach (fast, but unsafe when a peer dies). Rows "<lib>-dataplane" move the same bytes with
the backend's own worker/agent and progress thread but without descriptors, checksums or copies
(transport/dataplane.py), which separates the link's cost from the contract's. Writes JSON with the command.

    python -m benchmarks.transport --sizes 64K 1M 4.5M 32M --backends local tcp ucx nixl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.stats import percentile
from transport.checksum import FAST
from transport.registry import make_receiver, make_sender, unavailable
from transport.wire import describe

ROOT = Path(__file__).resolve().parents[1]
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
TARGET = 0.8
VERDICT_SIZE = 4718592


def parse_size(text: str) -> int:
    unit = UNITS.get(text[-1].upper(), 1)
    return int(float(text[:-1] if text[-1].upper() in UNITS else text) * unit)


def tensor(size: int) -> torch.Tensor:
    return torch.arange(size, dtype=torch.int64).to(torch.uint8)  # deterministic: the child builds the same


def iters_for(size: int, budget: int) -> int:
    return max(5, min(200, budget // max(size, 1)))


# ---------------------------------------------------------------- child side


async def child_backend(kind: str, sizes: list[int], budget: int) -> None:
    receiver = make_receiver(kind, "bench", **({"tcp": True} if kind == "local" else {}))
    await receiver.start()
    print(json.dumps({"address": receiver.address}), flush=True)
    for size in sizes:
        desc = describe("x", "x", tensor(size))[0]
        for i in range(iters_for(size, budget) + 3):
            await receiver.recv([desc.model_copy(update={"request_id": f"{size}-{i}"})], timeout=120)
    await receiver.close()


async def child_dataplane(lib: str, size: int) -> None:
    from transport.dataplane import NixlEcho, UcxEcho  # noqa: PLC0415 - optional packages

    echo = UcxEcho(size) if lib == "ucx" else NixlEcho(size)
    print(json.dumps({"address": echo.ucx.address if lib == "ucx" else echo.nx.address()}), flush=True)
    loop = asyncio.get_running_loop()
    await echo.start((await loop.run_in_executor(None, sys.stdin.readline)).strip())
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent is done
    await (echo.ucx.close() if lib == "ucx" else asyncio.to_thread(echo.nx.close))


def child_shm(name: str, sizes: list[int], budget: int) -> None:
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # the parent owns it; 3.11 would unlink it at our exit
    for size in sizes:
        for _ in range(iters_for(size, budget) + 3):
            if not os.read(0, 1):
                return
            os.write(1, b"k")  # the bytes are in the segment: a reader would use them in place
    shm.close()


def child_rawtcp(sizes: list[int], budget: int) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for size in sizes:
        buf = memoryview(bytearray(size))
        for _ in range(iters_for(size, budget) + 3):
            got = 0
            while got < size:
                n = conn.recv_into(buf[got:])
                if not n:
                    return
                got += n
            conn.sendall(b"k")


# ---------------------------------------------------------------- parent side


def spawn(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.transport", "--child", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def measure_shm(sizes: list[int], budget: int, tick) -> dict[int, list[float]]:
    shm = shared_memory.SharedMemory(create=True, size=max(sizes))
    child = spawn(["shm", shm.name, *map(str, sizes), "--budget", str(budget)])
    out: dict[int, list[float]] = {}
    try:
        seg = np.ndarray((max(sizes),), dtype=np.uint8, buffer=shm.buf)
        for size in sizes:
            src = tensor(size).numpy()
            times = []
            for i in range(iters_for(size, budget) + 3):
                t0 = time.perf_counter()
                np.copyto(seg[:size], src)
                child.stdin.write(b"g")
                child.stdin.flush()
                child.stdout.read(1)
                if i >= 3:
                    times.append(time.perf_counter() - t0)
                tick()
            out[size] = times
    finally:
        child.kill()
        child.wait(10)
        shm.close()
        shm.unlink()
    return out


def measure_rawtcp(sizes: list[int], budget: int, tick) -> dict[int, list[float]]:
    child = spawn(["rawtcp", *map(str, sizes), "--budget", str(budget)])
    out: dict[int, list[float]] = {}
    try:
        port = json.loads(child.stdout.readline())["port"]
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ack = bytearray(1)
        for size in sizes:
            src = memoryview(tensor(size).numpy())
            times = []
            for i in range(iters_for(size, budget) + 3):
                t0 = time.perf_counter()
                sock.sendall(src)
                sock.recv_into(ack)
                if i >= 3:
                    times.append(time.perf_counter() - t0)
                tick()
            out[size] = times
        sock.close()
    finally:
        child.kill()
        child.wait(10)
    return out


async def measure_backend(kind: str, sizes: list[int], budget: int, env: dict, tick) -> dict[int, list[float]]:
    child = spawn(["backend", kind, *map(str, sizes), "--budget", str(budget)], env)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # UCX reads its settings when the sender's context is made
    sender = make_sender(kind, timeout=120.0)
    out: dict[int, list[float]] = {}
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 120)
        address = json.loads(line)["address"]
        for size in sizes:
            t, times = tensor(size), []
            for i in range(iters_for(size, budget) + 3):
                t0 = time.perf_counter()
                await sender.send(address, f"{size}-{i}", {"x": t})
                if i >= 3:
                    times.append(time.perf_counter() - t0)
                tick()
            out[size] = times
        await asyncio.wait_for(asyncio.to_thread(child.wait, 60), 70)
    finally:
        await sender.close()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if child.poll() is None:
            child.kill()
            child.wait(10)
    return out


async def measure_dataplane(lib: str, sizes: list[int], budget: int, env: dict, tick) -> dict[int, list[float]]:
    from transport.dataplane import NixlPing, UcxPing  # noqa: PLC0415 - optional packages

    child = spawn(["dataplane", lib, str(max(sizes)), "--budget", str(budget)], env)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ping = UcxPing() if lib == "ucx" else NixlPing(max(sizes))
    out: dict[int, list[float]] = {}
    readline = lambda: asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 120)  # noqa: E731
    try:
        address = json.loads(await readline())["address"]
        if lib == "ucx":
            mine, data = ping.ucx.address, tensor(max(sizes)).numpy()
        else:
            await ping.connect(address)
            mine = ping.nx.address()
            ping.nx.pool.memory[: max(sizes)] = tensor(max(sizes))
        child.stdin.write((mine + "\n").encode())
        child.stdin.flush()
        assert (await readline()).strip() == b"ready"
        for size in sizes:
            times = []
            for i in range(iters_for(size, budget) + 3):
                t0 = time.perf_counter()
                await (ping.send(address, data[:size]) if lib == "ucx" else ping.send(size))
                if i >= 3:
                    times.append(time.perf_counter() - t0)
                tick()
            out[size] = times
    finally:
        await (ping.ucx.close() if lib == "ucx" else asyncio.to_thread(ping.nx.close))
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        child.kill()
        child.wait(10)
    return out


def summarize(times: dict[int, list[float]]) -> dict[str, dict]:
    rows = {}
    for size, ts in times.items():
        p50 = percentile(ts, 0.5)
        rows[str(size)] = {"iters": len(ts), "p50_ms": p50 * 1e3, "p99_ms": percentile(ts, 0.99) * 1e3,
                           "gbps": size / p50 / 1e9}
    return rows


async def run(a: argparse.Namespace, console: Console) -> dict:
    sizes, budget = a.sizes, a.budget
    kinds = [k for k in a.backends if not unavailable(k)]
    skipped = {k: unavailable(k) for k in a.backends if unavailable(k)}
    fast = [k for k in kinds if k in ("ucx", "nixl")]
    # host-cma: UCX with cross-memory attach, single-copy but unsafe when a peer dies (see transport/README.md)
    passes = [("host", {}, kinds), ("host-cma", {"UCX_TLS": "self,sm,tcp"}, [k for k in fast if k == "ucx"]),
              ("tcp", {"UCX_TLS": "tcp"}, fast)]
    steps = sum(iters_for(s, budget) + 3 for s in sizes) * (2 + 2 * sum(len(p[2]) for p in passes))
    results: dict[str, dict] = {}
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("transfers", total=steps)
        tick = lambda: progress.advance(bar)  # noqa: E731
        results["limit:shm"] = summarize(measure_shm(sizes, budget, tick))
        results["limit:rawtcp"] = summarize(measure_rawtcp(sizes, budget, tick))
        for path, env, pass_kinds in passes:
            for kind in pass_kinds:
                progress.update(bar, description=f"{kind} ({path})")
                results[f"{kind}:{path}"] = summarize(await measure_backend(kind, sizes, budget, env, tick))
            for lib in (k for k in pass_kinds if k in ("ucx", "nixl")):
                progress.update(bar, description=f"{lib} data plane ({path})")
                results[f"{lib}-dataplane:{path}"] = summarize(await measure_dataplane(lib, sizes, budget, env, tick))
    verdicts = {}
    key = str(VERDICT_SIZE) if VERDICT_SIZE in sizes else str(sizes[-1])
    for name, rows in results.items():
        if name.startswith("limit:"):
            continue
        kind, path = name.split(":")
        limit = "limit:shm" if path.startswith("host") else "limit:rawtcp"
        share = rows[key]["gbps"] / results[limit][key]["gbps"]
        verdicts[name] = (f"{kind} over the {path} path at {int(key) / 2**20:.1f} MB: {rows[key]['gbps']:.2f} GB/s = "
                          f"{share:.0%} of {limit.split(':')[1]} ({results[limit][key]['gbps']:.2f} GB/s); "
                          f"target {TARGET:.0%}: {'met' if share >= TARGET else 'NOT met'}")
    return {"results": results, "verdicts": verdicts, "skipped": skipped}


def table(report: dict) -> Table:
    sizes = list(next(iter(report["results"].values())))
    t = Table(title="transport: p50 latency (ms) / throughput (GB/s)")
    t.add_column("backend:path")
    for s in sizes:
        t.add_column(f"{int(s) / 2**20:.3g} MB", justify="right")
    for name, rows in report["results"].items():
        t.add_row(name, *(f"{rows[s]['p50_ms']:.3f} / {rows[s]['gbps']:.2f}" for s in sizes))
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        budget = int(argv[argv.index("--budget") + 1])
        rest = argv[1 : argv.index("--budget")]
        if rest[0] == "backend":
            asyncio.run(child_backend(rest[1], [int(s) for s in rest[2:]], budget))
        elif rest[0] == "dataplane":
            asyncio.run(child_dataplane(rest[1], int(rest[2])))
        elif rest[0] == "shm":
            child_shm(rest[1], [int(s) for s in rest[2:]], budget)
        else:
            child_rawtcp([int(s) for s in rest[1:]], budget)
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.transport", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[65536, 1 << 20, VERDICT_SIZE, 32 << 20],
                   help="message sizes, e.g. 64K 1M 4.5M 32M")
    p.add_argument("--backends", nargs="+", default=["local", "tcp", "ucx", "nixl"], help="backends to measure")
    p.add_argument("--budget", type=parse_size, default=parse_size("400M"),
                   help="bytes per size and backend (iterations = budget / size, 5..200)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/transport.json")
    a = p.parse_args(argv)
    console = Console()
    load_before = os.getloadavg()[0]
    report = asyncio.run(run(a, console))
    report = {"command": "python -m benchmarks.transport " + " ".join(argv), "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "fast_crc32": FAST, "load_average_1min": [load_before, os.getloadavg()[0]],
        "note": "ratios are side by side in this run; with other work on the machine (see load) they vary ~2x"},
        **report}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    console.print(table(report))
    for line in report["verdicts"].values():
        console.print(line)
    for kind, why in report["skipped"].items():
        console.print(f"[yellow]skipped {kind}: {why}")
    console.print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
