"""Does a briefly woken CPU job on a core where another process computes continuously run at full speed
(the scheduler lets it preempt) or at half (fair sharing)? Evidence for the simulator's stack models
(Simulator(stack_preempts=...), sim_fidelity_layouts.md). Pins itself and a busy loop to one core and
times jobs of 1-32 ms of CPU, alone and beside the busy loop; ~10 s of CPU, so run it under the host's
measurement lock. A shared host makes single figures noisy: compare the ratios' trend, not one value.

    python -m benchmarks.sched_wake_probe [--core 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

SIZES_S = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032)


def spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def busy(core: int, stop) -> None:
    os.sched_setaffinity(0, {core})
    while not stop.is_set():
        spin(20000)


def _once(n: int) -> float:
    t = time.perf_counter()
    spin(n)
    return time.perf_counter() - t


def timed(n: int, period_s: float, reps: int) -> float:
    """Mean wall seconds of `reps` jobs of `n` iterations, each after sleeping `period_s` (a fresh wake-up)."""
    out = []
    for _ in range(reps):
        time.sleep(period_s)
        t = time.perf_counter()
        spin(n)
        out.append(time.perf_counter() - t)
    return statistics.mean(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", type=int, default=1)
    core = ap.parse_args().core
    os.sched_setaffinity(0, {core})
    per = min(_once(200000) for _ in range(7)) / 200000  # the fastest of a few: a busy host only slows them
    alone = {s: timed(int(s / per), 0.03, 15) for s in SIZES_S}
    stop = mp.Event()
    proc = mp.Process(target=busy, args=(core, stop))
    proc.start()
    time.sleep(0.3)
    beside = {s: timed(int(s / per), 0.03, 25) for s in SIZES_S}
    stop.set()
    proc.join()
    for s in SIZES_S:
        print(f"{s * 1e3:4.0f} ms job: alone {alone[s] * 1e3:6.2f} ms, beside a busy process {beside[s] * 1e3:6.2f} ms "
              f"({beside[s] / alone[s]:.2f}x; processor sharing would be 2x, preemption 1x)")


if __name__ == "__main__":
    main()
