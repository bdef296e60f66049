"""The host's speed moment to moment during a live run, read from the workers' timers, and the layouts'
simulation with that much host noise (sim_fidelity --layouts).

On this shared host the same run's decode steps do not take the same time twice, and how much they wander changes
with the host's phase. Every live request reports the compute of the decode steps it was in (decode_s); over its
n - 1 steps that is its mean decode step. Across a run's requests these spread (log-sd, read robustly from the 10th
to the 90th percentile) 0.07-0.21 (median 0.11) in the quiet phases of 2026-12-06 and 0.20-0.54 (median 0.29) in the
slow ones (benchmarks/results/sim_fidelity_s28/). Some of it is the simulator's own: batches of different sizes and contexts
make steps of different lengths. The rest is the host: the simulator's HostNoise (coordinator/planner/sim_noise.py),
a lognormal factor on every forward (log-sd sigma), constant for a period and drawn anew for the next.

How long the host stays fast or slow shows in how alike neighbouring requests are: the lag-1 autocorrelation of their
log mean decode step, in arrival order, has a median of 0.28 in the quiet phases and 0.54 in the slow ones, and is
0.23-0.65 there at the lowest rates too (2.5-3 req/s), where neighbours arrive 330-400 ms apart and barely overlap:
the host stays slow or fast for hundreds of ms.

`at_run_noise` reads each run's noise as `at_run_speed` (sim_fidelity_speed.py) reads its speed, from the workers'
timers, never from the figures judged: for each period of PERIODS_S it finds the sigma whose simulated requests' mean
decode steps spread as the live ones did (the simulator keeps each request's decode compute as a live worker's timer
reports it, sim_compute.py), at the speed whose compute matches the run's (the noise's mean is in the compute, so the
two are read together); of those it keeps the period whose simulated neighbours are as alike as the live ones. The
figures judged (goodput, P50 TTFT, mean TPOT) then test whether that much noise, that long, does to the latencies
what the live host did.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from benchmarks.sim_fidelity_speed import ITERATIONS, SPEED_GROUPS, mismatch, speed_factors

PERIODS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""The periods tried, seconds (sim_noise.HostNoise.period_s); 0.05 was fitted with sigma 0.25 on the saved records of
2026-12-03 (benchmarks/results/sim_fidelity_noise_trial/), before the noise was read run by run."""
MIN_STEPS = 4
"""Requests with fewer decode steps are left out (a mean of one or two steps is one step's noise)."""
SPAN = 2.5631
"""The 10th-90th percentile span of a standard normal: a log spread over it is a log-sd, robust to outliers."""
ROUNDS = ITERATIONS + 2
"""Rounds of reading speed and sigma together per period (the best kept)."""


def mean_of_draws(draws: list[dict]) -> dict:
    """Several draws of one noisy simulation (sim_cell results) as one: numbers averaged, dicts key by key (the
    first draw's keys), lists and tuples element by element, None where any draw has None; anything else (text,
    flags) the first draw's."""
    if not draws:
        raise ValueError("no draws to average")
    return _mean(draws)


def _mean(xs: list):
    first = xs[0]
    if any(x is None for x in xs):
        return None
    if isinstance(first, bool) or not isinstance(first, (int, float, dict, list, tuple)):
        return first
    if isinstance(first, dict):
        return {k: _mean([x.get(k) for x in xs]) for k in first}
    if isinstance(first, (list, tuple)):
        if len({len(x) for x in xs}) != 1:
            raise ValueError(f"draws disagree on a sequence's length: {[len(x) for x in xs]}")
        return type(first)(_mean(list(column)) for column in zip(*xs))
    return sum(xs) / len(xs)


def step_stats(decode_s: list[float | None], output_tokens: list[int]) -> tuple[float, float] | None:
    """(spread, lag-1 autocorrelation) of the requests' log mean decode step (log(decode_s / (output_tokens - 1))),
    in the order given (arrival): the spread is the log-sd read from the 10th to the 90th percentile. None with fewer
    than 10 requests of MIN_STEPS steps or more, or all alike."""
    logs = [math.log(d / (n - 1)) for d, n in zip(decode_s, output_tokens) if d is not None and d > 0 and n - 1 >= MIN_STEPS]
    if len(logs) < 10:
        return None
    ordered = sorted(logs)
    spread = (_quantile(ordered, 0.9) - _quantile(ordered, 0.1)) / SPAN
    mean = sum(logs) / len(logs)
    var = sum((x - mean) ** 2 for x in logs)
    if var < 1e-12:   # all alike (to rounding): nothing to correlate
        return None
    return spread, sum((a - mean) * (b - mean) for a, b in zip(logs, logs[1:])) / var


def _quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between the sorted `xs` (numpy's default)."""
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def live_step_stats(saved: dict[str, list]) -> tuple[float, float] | None:
    """step_stats of a live run's finished requests (saved records); None where the records hold no decode_s."""
    if "decode_s" not in saved:
        return None
    ok = [i for i, e in enumerate(saved["error"]) if e is None]
    return step_stats([saved["decode_s"][i] for i in ok], [saved["output_tokens"][i] for i in ok])


def next_sigma(target: float, base: float, tried: list[tuple[float, float]]) -> float:
    """The sigma to try next for a spread of `target`, where the run without noise spreads `base` and `tried`
    holds (sigma, spread) of the noisy rounds so far: the spreads add as variances, spread^2 = base^2 + (c sigma)^2,
    with c read from the last round that spread wider than `base` (1 before any)."""
    excess = max(0.0, target * target - base * base)
    c = 1.0
    for sigma, spread in reversed(tried):
        if sigma > 0 and spread > base:
            c = math.sqrt(spread * spread - base * base) / sigma
            break
    return math.sqrt(excess) / c


def sigma_at(simulate: Callable[[tuple[float, float, float], float], dict], live: dict[str, float], target: float,
             start: tuple[tuple[float, float, float], dict] | None = None) -> tuple:
    """At one period, `simulate(speed, sigma)` rounds: (worst mismatch, speed, sigma, result, compute mismatch,
    spread mismatch) of the round whose compute is closest to `live` and whose spread is closest to `target` (the
    larger of the two mismatches smallest). `start`: the first round (at speed 1, without noise) already run, as
    (speed, result)."""
    speed, sigma, best, tried, base = (1.0, 1.0, 1.0), 0.0, None, [], None
    for i in range(ROUNDS):
        out = start[1] if i == 0 and start is not None else simulate(speed, sigma)
        spread = out["step_stats"][0] if out["step_stats"] else None
        miss = mismatch(live, out["compute_s"])
        miss_spread = spread / target - 1 if spread and target else 0.0
        worst = max([abs(m) for m in miss.values()] + [abs(miss_spread)])
        if best is None or worst < best[0]:
            best = (worst, speed, sigma, out, miss, miss_spread)
        if base is None:
            base = spread or 0.0
        elif sigma > 0 and spread is not None:
            tried.append((sigma, spread))
        speed = speed_factors(live, out["compute_s"], speed)
        if "prefill" not in live:
            speed = (speed[0], speed[2], speed[2])
        sigma = next_sigma(target, base, tried)
    return best


def at_run_noise(simulate: Callable[[tuple[float, float, float], float, float], dict], live: dict[str, float],
                 target: tuple[float, float]) -> dict:
    """`simulate(speed, sigma, period_s)` (a sim_cell with its compute_s and step_stats) with the host noise read from
    the run's timers: per period of PERIODS_S the speed (encode, prefill, decode) and sigma of sigma_at, for the
    run's `live` compute and `target` (its live_step_stats); of those, the period whose simulated lag-1
    autocorrelation is closest to the run's. The result carries `speed`, `sigma`, `period_s`, the statistics it
    matched and the mismatches left."""
    readings = []
    quiet = ((1.0, 1.0, 1.0), simulate((1.0, 1.0, 1.0), 0.0, PERIODS_S[0]))  # without noise the period is moot
    for period in PERIODS_S:
        worst, speed, sigma, out, miss, miss_spread = sigma_at(
            lambda sp, sg, p=period: simulate(sp, sg, p), live, target[0], quiet)
        lag1 = out["step_stats"][1] if out["step_stats"] else math.nan
        readings.append((abs(lag1 - target[1]) if math.isfinite(lag1) else math.inf, period, speed, sigma, out, miss,
                         miss_spread, lag1))
    _, period, speed, sigma, out, miss, miss_spread, lag1 = min(readings, key=lambda r: r[0])
    return out | {"speed": {k: round(f, 4) for k, f in zip(SPEED_GROUPS, speed)}, "sigma": round(sigma, 4),
                  "period_s": period, "live_step_stats": [round(x, 4) for x in target],
                  "sim_step_stats": [round(x, 4) for x in out["step_stats"]] if out["step_stats"] else None,
                  "lag1_by_period": {f"{r[1]:g}": round(r[7], 3) for r in readings},
                  "compute_mismatch": {k: round(m, 4) for k, m in miss.items()},
                  "spread_mismatch": round(miss_spread, 4)}
