"""How much this host's speed wanders from moment to moment: the simulator's HostNoise, measured apart.

The simulator's host noise (coordinator/planner/sim_noise.py) makes every forward take a factor of its profiled
time, lognormal with median 1 and log-sd `sigma`, constant over windows of `period_s`. This measures the two on
the host itself, with nothing else of tierserve running: one process per core, pinned, each repeating one real
workload of the cluster (core_sharing.py's: a decode step of 4 sequences over a 320-token cache, or the prefill
of a 315-token prompt) back to back for `--seconds`, every operation's duration kept. For windows of length T
the log of each window's median duration, less the run's median, has a spread sd(T); with a factor that holds
for `period` and per-operation jitter averaging out within a window, sd(T) stays near sigma for T below the
period and falls for T beyond it. Reported per window length, and the (sigma, period) of the HostNoise whose
own windows give the closest spreads (simulated with its generator on the same windows).

    python -m benchmarks.host_noise --kind decode --seconds 20 --out benchmarks/results/host_noise.json
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.bench.report import write_json
from benchmarks.core_sharing import ready_op, run_together

WINDOWS_MS = (5, 10, 25, 50, 100, 250, 500, 1000)
SIGMAS = tuple(round(0.02 * i, 2) for i in range(0, 21))
PERIODS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500)


def _probe(kind: str, core: int, seconds: float, ready: mp.Queue, go: mp.Event, out: mp.Queue) -> None:
    op = ready_op(kind, core, ready, go)
    t0 = time.perf_counter()
    ends, n = [], 0
    while time.perf_counter() - t0 < seconds:
        op(n)
        n += 1
        ends.append(time.perf_counter() - t0)
    out.put((core, ends))


def record(kind: str, cores: list[int], seconds: float) -> dict[int, list[float]]:
    """Each core's operation end times (seconds since the start), all cores running at once."""
    return dict(run_together(_probe, [(kind, c, seconds) for c in cores], seconds))


def window_spreads(ends: list[float], windows_ms=WINDOWS_MS) -> dict[int, float]:
    """sd of log(window median duration / overall median) for each window length; windows of < 3 ops skipped."""
    durations = [(b, b - a) for a, b in zip([0.0, *ends], ends)]
    overall = statistics.median(d for _, d in durations)
    out = {}
    for w in windows_ms:
        groups: dict[int, list[float]] = {}
        for end, d in durations:
            groups.setdefault(int(end * 1000 // w), []).append(d)
        logs = [math.log(statistics.median(g) / overall) for g in groups.values() if len(g) >= 3]
        if len(logs) >= 5:
            out[w] = statistics.pstdev(logs)
    return out


def model_spreads(sigma: float, period_ms: float, op_ms: float, seconds: float, jitter: float,
                  windows_ms=WINDOWS_MS) -> dict[int, float]:
    """The same spreads for a HostNoise(sigma, period) factor times per-op lognormal `jitter`, ops of `op_ms`."""
    import random

    from coordinator.planner.sim_noise import HostNoise, HostSpeed

    t = 0.0
    speed = HostSpeed(HostNoise(sigma, period_ms / 1000), clock=lambda: t)
    rng = random.Random(1)
    ends = []
    while t < seconds:
        t += op_ms / 1000 * speed.factor() * math.exp(rng.gauss(0.0, jitter))
        ends.append(t)
    return window_spreads(ends, windows_ms)


def fit(spreads: dict[int, float], op_ms: float, seconds: float) -> dict:
    """The (sigma, period, jitter) whose modelled spreads are closest (mean squared difference over windows)."""
    jitter = spreads.get(min(spreads), 0.0)
    best = None
    for sigma in SIGMAS:
        for period in PERIODS_MS:
            for j in (0.0, jitter / 2, jitter):
                m = model_spreads(sigma, period, op_ms, seconds, j, tuple(spreads))
                err = statistics.fmean((m.get(w, 0.0) - s) ** 2 for w, s in spreads.items())
                if best is None or err < best[0]:
                    best = (err, sigma, period, j)
    return {"sigma": best[1], "period_ms": best[2], "op_jitter": round(best[3], 4), "rms_error": round(math.sqrt(best[0]), 4)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_noise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("decode", "prefill"), default="decode", help="the workload (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds each core runs (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    if a.seconds < 2:
        p.error("--seconds must be >= 2 (the longest window is 1 s)")
    cores = sorted(os.sched_getaffinity(0))
    ends = record(a.kind, cores, a.seconds)
    rows = []
    for core in cores:
        e = ends[core]
        op_ms = 1000 * a.seconds / len(e)
        spreads = window_spreads(e)
        fitted = fit(spreads, op_ms, a.seconds)
        rows.append({"core": core, "ops": len(e), "op_ms": round(op_ms, 3),
                     "spread_by_window_ms": {str(k): round(v, 4) for k, v in spreads.items()}, "fit": fitted})
        print(f"core {core}: {len(e)} ops of {op_ms:.2f} ms; log-sd of window medians "
              + ", ".join(f"{k} ms {v:.3f}" for k, v in spreads.items())
              + f"; closest HostNoise: sigma {fitted['sigma']}, period {fitted['period_ms']} ms "
                f"(per-op jitter {fitted['op_jitter']}, rms {fitted['rms_error']})")
    if a.out:
        write_json(a.out, {"command": " ".join(["python -m benchmarks.host_noise", *sys.argv[1:]]),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": a.kind,
                           "seconds": a.seconds, "load_average": os.getloadavg(), "cores": rows})


if __name__ == "__main__":
    main()
