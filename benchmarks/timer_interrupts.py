"""How much of the delay another process on its core causes a worker lands inside the worker's compute timer.

A live worker times each forward with a wall clock (encode_s, prefill_s, decode_s), and the simulator reads the
host's speed from those timers (sim_fidelity_speed.py). Where something else runs on the worker's core, the worker
is delayed in one of two places: inside a forward (the other process preempts it mid-forward: its timer reads
longer) or before one (the worker wakes to work while the other runs, and starts late: its timer does not see
it). The simulator runs shared cores by processor sharing, where every delay is inside the job; the share its
timers see is `compute_stretched` (sim_compute.py). This measures that share directly, per pair of processes:

A "timed" process (a worker's forward: encode, prefill or decode) and a "competitor" (another worker's forward,
or `stack`: the coordinator's kind of brief Python work) are pinned to one core. Each alternates a random idle gap
(exponential; its mean sets the process's duty cycle, as a live worker idles between requests) with one operation.
The timed process records, per operation, how late it started after its gap ended (wall clock against the gap's
deadline) and its wall and CPU time (wall - CPU: the time it did not run mid-forward). Alone, then beside the
competitor, then alone again:

    inside  = (wall - CPU) beside - alone          (delay the timer sees)
    before  = start lateness beside - alone        (delay it does not)
    seen    = inside / (inside + before)

    python -m benchmarks.timer_interrupts --pairs encode+stack decode+stack decode+decode encode+prefill \\
        --rounds 3 --out benchmarks/results/sim_fidelity_s26/timer_interrupts.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

from rich.progress import Progress

from benchmarks.bench.report import write_json
from benchmarks.core_sharing import KINDS, ready_op, run_together

TIMED = ("encode", "prefill", "decode")


def _loop(kind: str, core: int, seconds: float, duty: float, timed: bool, seed: int,
          ready: mp.Queue, go: mp.Event, out: mp.Queue) -> None:
    """One process: `kind`'s operation after random idle gaps, for `seconds`; puts (kind, rows) on `out` where a
    row is (start lateness, wall, CPU) of one operation (timed) or nothing (a competitor)."""
    op = ready_op(kind, core, ready, go)
    t0 = time.perf_counter()
    op(0)
    mean_op = time.perf_counter() - t0
    gap = mean_op * (1.0 - duty) / duty
    rng = random.Random(seed)
    rows, n, end = [], 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        deadline = time.perf_counter() + rng.expovariate(1.0 / gap)
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)
        w0, c0 = time.perf_counter(), time.process_time()
        op(n)
        w1, c1 = time.perf_counter(), time.process_time()
        n += 1
        if timed:
            rows.append((w0 - deadline, w1 - w0, c1 - c0))
    out.put((("timed" if timed else "other"), rows))


def _means(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    return {"ops": len(rows), "late_ms": statistics.fmean(r[0] for r in rows) * 1e3,
            "wall_ms": statistics.fmean(r[1] for r in rows) * 1e3,
            "off_cpu_ms": statistics.fmean(r[1] - r[2] for r in rows) * 1e3}


def timed_run(kind: str, other: str | None, core: int, seconds: float, duty: float, seed: int) -> dict[str, float]:
    """The timed process's means, alone (`other` None) or beside `other`."""
    args = [(kind, core, seconds, duty, True, seed)]
    if other is not None:
        args.append((other, core, seconds, duty, False, seed + 1))
    got = dict(run_together(_loop, args, seconds))
    if len(got["timed"]) < 20:
        raise RuntimeError(f"{kind}: {len(got['timed'])} operations in {seconds} s; give it more --seconds")
    return _means(got["timed"])


def pair_round(kind: str, other: str, core: int, seconds: float, duty: float, seed: int) -> dict:
    """Alone, beside, alone again; the share of the delay the timer saw."""
    before = timed_run(kind, None, core, seconds, duty, seed)
    beside = timed_run(kind, other, core, seconds, duty, seed)
    after = timed_run(kind, None, core, seconds, duty, seed)
    alone = {k: (before[k] + after[k]) / 2 for k in ("late_ms", "wall_ms", "off_cpu_ms")}
    inside = beside["off_cpu_ms"] - alone["off_cpu_ms"]
    late = beside["late_ms"] - alone["late_ms"]
    total = inside + late
    return {"alone": [before, after], "beside": beside, "inside_ms": round(inside, 4), "before_ms": round(late, 4),
            "seen": round(inside / total, 4) if total > 0 else None}


def parse_pair(text: str) -> tuple[str, str]:
    parts = text.split("+")
    if len(parts) != 2 or parts[0] not in TIMED or parts[1] not in KINDS:
        raise argparse.ArgumentTypeError(f"a pair is TIMED+OTHER with TIMED among {', '.join(TIMED)} and OTHER among "
                                         f"{', '.join(KINDS)}, got {text!r}")
    return parts[0], parts[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timer_interrupts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=parse_pair, nargs="+", default=[("encode", "stack")], metavar="TIMED+OTHER",
                   help="the timed worker's operation and what shares its core (default: encode+stack)")
    p.add_argument("--rounds", type=int, default=3, help="alone/beside/alone rounds per pair (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds each measurement runs (default: %(default)s)")
    p.add_argument("--duty", type=float, default=0.3,
                   help="share of its time each process computes, the rest idle gaps (default: %(default)s)")
    p.add_argument("--core", type=int, default=0, help="the CPU core both processes are pinned to (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.seconds <= 0 or not 0 < a.duty < 1:
        p.error("--rounds must be >= 1, --seconds > 0 and --duty between 0 and 1 (exclusive)")
    if a.core not in os.sched_getaffinity(0):
        p.error(f"--core {a.core} is not one this process may run on ({sorted(os.sched_getaffinity(0))})")
    rows = []
    with Progress() as bar:
        task = bar.add_task("timer interrupts", total=len(a.pairs) * a.rounds)
        for kind, other in a.pairs:
            rounds = []
            for r in range(a.rounds):
                rounds.append(pair_round(kind, other, a.core, a.seconds, a.duty, seed=2 * r))
                bar.advance(task)
            seen = [r["seen"] for r in rounds if r["seen"] is not None]
            rows.append({"pair": f"{kind}+{other}", "rounds": rounds,
                         "seen_median": statistics.median(seen) if seen else None})
            bar.console.print(f"{kind}+{other}: the timer saw {rows[-1]['seen_median']} of the delay (rounds: "
                              + "; ".join(f"inside {r['inside_ms']:.2f} ms, before {r['before_ms']:.2f} ms"
                                          for r in rounds) + ")")
    if a.out:
        write_json(a.out, {"command": " ".join(["python -m benchmarks.timer_interrupts", *sys.argv[1:]]),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "core": a.core,
                           "seconds": a.seconds, "duty": a.duty, "pairs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
