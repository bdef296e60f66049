"""The host's speed over a live run, and the layouts' simulation following it (sim_fidelity --layouts).

A run's mean speed (sim_fidelity_speed.py) does not carry the host changing phase within the run: in the slow phases
of 2026-12-06 the live latency spreads were far wider than the simulated ones. `at_run_trace` reads the same workers'
timers per window of the run (TRACE_WINDOWS of them): each request's encode compute where it was sent, its prefill's
at its first token, its decode's at the middle of its decode; the simulation's forwards where they end (metered in
TRACE_BINS bins a window), each shared between the two windows around it (`weights`). It simulates the run at its
mean speed times a sim_noise.HostTrace of per-window factors, corrected window by window as the mean speed is, until
each window's simulated compute is the run's (`sim_run_trace` in the report). On the saved records it did not close
the slow phases' misses (benchmarks/results/sim_fidelity_s25/README.md): those are not the speed drifting over
seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from benchmarks.sim_fidelity_speed import ITERATIONS, LLM_GROUPS, STAGES, calibrated, speed_factors
from coordinator.planner.sim_noise import HostTrace

TRACE_WINDOWS = 6
"""Windows a run's speed trace has, over its arrivals (the last one also holds what ends after the last arrival):
16-48 s runs (120 requests at 2.5-11 req/s) give 2.7-8 s windows of ~20 requests each."""


TRACE_CLOSE_ENOUGH = 0.002
"""The rounds stop once the windows' compute is this close to the run's (compute-weighted mean |mismatch|)."""


def trace_window_s(saved: dict[str, list]) -> float:
    """The window of a run's speed trace: its sending span over TRACE_WINDOWS (1 s for a run sent at once)."""
    return (max(saved["sent"]) / TRACE_WINDOWS) or 1.0


TRACE_BINS = 8
"""Bins per trace window the simulation meters its compute in (Simulator(compute_window_s=window / TRACE_BINS)),
placed as live_windows places a request's compute (`weights`)."""


def live_windows(saved: dict[str, list], window_s: float) -> list[dict[str, float]]:
    """A run's compute per trace window (TRACE_WINDOWS) and stage, over its requests that finished: encode where
    the request was sent, prefill at its first token, decode at the middle of its decode (stage_times), each shared
    between the two windows whose middles it lies between (`weights`); a stage the records do not hold is left out."""
    windows = [dict.fromkeys((s for s in STAGES if f"{s}_s" in saved), 0.0) for _ in range(TRACE_WINDOWS)]
    for i, error in enumerate(saved["error"]):
        if error is not None:
            continue
        for stage, t in stage_times(saved, i).items():
            if stage in windows[0]:
                for w, weight in weights(t, window_s):
                    windows[w][stage] += (saved[f"{stage}_s"][i] or 0.0) * weight
    return windows


def stage_times(saved: dict[str, list], i: int) -> dict[str, float]:
    """Where live_windows places request `i`'s compute of each stage, seconds after the run's start."""
    sent, ttft, e2e = saved["sent"][i], saved["ttft"][i], saved["e2e"][i]
    return {"encode": sent, "prefill": sent + ttft, "decode": sent + (ttft + e2e) / 2}


def weights(t: float, window_s: float) -> list[tuple[int, float]]:
    """(window, share) of compute at time `t`: split linearly between the two windows whose middles `t` lies between
    (all to the first before its middle, to the last after its), so that compute moving a little in time moves
    between windows a little, not all at once as at a hard edge."""
    x = t / window_s - 0.5
    if x <= 0:
        return [(0, 1.0)]
    if x >= TRACE_WINDOWS - 1:
        return [(TRACE_WINDOWS - 1, 1.0)]
    w = math.floor(x)
    return [(w, 1.0 - (x - w)), (w + 1, x - w)]


def sim_windows(compute_windows: dict[int, dict[str, float]], window_s: float) -> list[dict[str, float]]:
    """A simulation's compute_windows (bins of window_s / TRACE_BINS) folded into trace windows as live_windows
    folds a run's, each bin at its middle."""
    windows = [dict.fromkeys(STAGES, 0.0) for _ in range(TRACE_WINDOWS)]
    for index, stages in compute_windows.items():
        for w, weight in weights((index + 0.5) * window_s / TRACE_BINS, window_s):
            for stage, seconds in stages.items():
                windows[w][stage] += seconds * weight
    return windows


def at_run_trace(simulate: Callable[[HostTrace], dict], live: list[dict[str, float]], window_s: float) -> dict:
    """`simulate(trace)` (a sim_cell at the run's mean speed, with its compute per window: compute_windows) at the
    trace, of those the rounds tried, whose per-window compute is closest to the run's `live` windows (live_windows;
    the compute-weighted mean of the windows' |mismatch| smallest; ITERATIONS rounds, fewer once within
    TRACE_CLOSE_ENOUGH); each round corrects every window's factors by its own live / simulated compute
    (speed_factors). The result carries the trace and that mismatch."""
    encode, llm = [1.0] * TRACE_WINDOWS, [1.0] * TRACE_WINDOWS
    best = None
    for _ in range(ITERATIONS):
        trace = HostTrace(window_s, tuple(encode), tuple(llm))
        out = simulate(trace)
        simulated = sim_windows(out["compute_windows"], window_s)
        miss = _weighted_mismatch(live, simulated)
        if best is None or miss < best[0]:
            best = (miss, trace, out)
        if miss < TRACE_CLOSE_ENOUGH:
            break
        for w in range(TRACE_WINDOWS):
            encode[w], llm[w] = speed_factors(live[w], simulated[w], (encode[w], llm[w]), LLM_GROUPS)
    miss, trace, out = best
    return out | {"trace": {"window_s": round(trace.window_s, 3), "encode": [round(f, 4) for f in trace.encode],
                            "llm": [round(f, 4) for f in trace.llm]},
                  "trace_mismatch": round(miss, 4)}


def _weighted_mismatch(live: list[dict[str, float]], simulated: list[dict[str, float]]) -> float:
    """Over the windows and the factors' stages (calibrated), |simulated / live - 1| weighted by the live compute."""
    total = weighted = 0.0
    for run, sim in zip(live, simulated):
        for seconds, simulated_s in calibrated(run, sim, LLM_GROUPS).values():
            if seconds and simulated_s:
                total += seconds
                weighted += seconds * abs(simulated_s / seconds - 1)
    return weighted / total if total else 0.0
