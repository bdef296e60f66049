"""The host's speed during a live run, and the layouts' simulation at that speed (sim_fidelity --layouts).

On this shared 2-core host the same layout, code and requests run 1.3-1.8x slower in some phases than in
others (two live runs minutes apart: the decode worker's steps 2.34 vs 3.06 ms; sim_fidelity_layouts.at-eb12f4f),
while the profiles, taken minutes away, do not carry the phase. The workers' own timers do: every live request
reports the compute of its micro-batch's encoder call (encode_s) and of the engine steps it was in (prefill_s,
decode_s), and the simulator sums the same from its run (Simulator(record_compute=True), sim_compute.py). Their
ratio is the host's speed in that run against the profile: for the encoder, the LLM's prefill steps and its decode
steps.

`at_run_speed` simulates a run at its own speed: the profile's encode, prefill and decode times scaled by those
ratios (the overheads and the transfers with the decode's, as PerfModel.slowdown scales them), found by iterating
(a scaled step changes how the engine batches, hence what the sums weigh) until the simulated compute matches the
run's. Prefill and decode are read apart: the host's slow phases slow a short forward (a decode step, ~2 ms) and a
long one (a prefill, ~20 ms) by different amounts, either way round, and one LLM factor, read mostly from the decode
steps, put the slow phases' simulated prefill compute at 0.73-1.54x the live one where the decode's matched
(benchmarks/results/sim_fidelity_s27/).
Only the compute's total is taken from the run; when and how long requests wait, how the engine batches, the
hops, the hand-offs and the stack's CPU stay the simulator's: what the figures judged (goodput, P50 TTFT, mean
TPOT) test. Both readings are reported: at the profile's speed (`sim`), at each run's
(`sim_run_speed`).
The same timers read window by window give the host's speed over the run: sim_fidelity_trace.py.
"""

from __future__ import annotations

from collections.abc import Callable

ITERATIONS = 6
"""Rounds of scaling (the best kept). The simulation is discrete (a step more or less in a batch, a request
stolen or not), so the rounds come within 1-2 % of the run's compute rather than converge: a 'live' run simulated
at (1.25, 1.4, 1.4) is read back at (1.25, 1.40, 1.37-1.40) (tests/planner/test_sim_fidelity_speed.py)."""
STAGES = ("encode", "prefill", "decode")
SPEED_GROUPS: dict[str, tuple[str, ...]] = {"encode": ("encode",), "prefill": ("prefill",), "decode": ("decode",)}
"""A run's speed: one factor per stage the workers time (encode, prefill, decode), in this order."""
LLM_GROUPS: dict[str, tuple[str, ...]] = {"encode": ("encode",), "llm": ("prefill", "decode")}
"""The encoder's factor and one for the LLM's two stages (the speed trace's windows, sim_fidelity_trace.py)."""


def live_compute(saved: dict[str, list]) -> dict[str, float]:
    """A run's request-weighted compute seconds per stage, over its requests that finished (from the saved
    records; a stage the records do not hold, as before 2026-12-06 for encode and prefill, is left out)."""
    ok = [i for i, e in enumerate(saved["error"]) if e is None]
    return {stage: sum(saved[f"{stage}_s"][i] or 0.0 for i in ok) for stage in STAGES if f"{stage}_s" in saved}


def calibrated(live: dict[str, float], simulated: dict[str, float],
               groups: dict[str, tuple[str, ...]] = SPEED_GROUPS) -> dict[str, tuple[float, float]]:
    """(live, simulated) compute of what each factor of `groups` answers for, over the stages the live run holds."""
    out = {}
    for name, stages in groups.items():
        held = [s for s in stages if s in live]
        out[name] = (sum(live[s] for s in held), sum(simulated.get(s, 0.0) for s in held))
    return out


def speed_factors(live: dict[str, float], simulated: dict[str, float], speed: tuple[float, ...],
                  groups: dict[str, tuple[str, ...]] = SPEED_GROUPS) -> tuple[float, ...]:
    """`speed` (a factor per group) corrected once by the live / simulated compute (calibrated); a factor with
    nothing to compare stays."""
    pairs = calibrated(live, simulated, groups)
    return tuple(f * (pairs[k][0] / pairs[k][1] if pairs[k][0] and pairs[k][1] else 1.0)
                 for f, k in zip(speed, groups))


def mismatch(live: dict[str, float], simulated: dict[str, float]) -> dict[str, float]:
    """simulated / live - 1 for what each factor answers for (calibrated)."""
    return {k: sim / run - 1 for k, (run, sim) in calibrated(live, simulated).items() if run and sim}


def at_run_speed(simulate: Callable[[tuple[float, float, float]], dict], live: dict[str, float]) -> dict:
    """`simulate(speed)` (a sim_cell with its compute_s) at the speed (encode, prefill, decode), of those the rounds
    tried, whose compute is closest to the run's `live` compute (the largest mismatch smallest); the result carries
    `speed`, the compute it matched and the mismatch left. Records without prefill compute (before 2026-12-06) give
    the prefill the decode's factor, one LLM factor as then."""
    speed, best = (1.0, 1.0, 1.0), None
    for _ in range(ITERATIONS):
        out = simulate(speed)
        miss = mismatch(live, out["compute_s"])
        worst = max((abs(m) for m in miss.values()), default=0.0)
        if best is None or worst < best[0]:
            best = (worst, speed, out, miss)
        speed = speed_factors(live, out["compute_s"], speed)
        if "prefill" not in live:
            speed = (speed[0], speed[2], speed[2])
    _, speed, out, miss = best
    return out | {"speed": {k: round(f, 4) for k, f in zip(SPEED_GROUPS, speed)},
                  "live_compute_s": {k: round(v, 4) for k, v in live.items()},
                  "compute_mismatch": {k: round(m, 4) for k, m in miss.items()}}


def mean_figures(runs: list[dict], keys: list[str]) -> dict[str, float]:
    """The runs' simulated figures averaged, as the live side averages its two runs."""
    return {k: round(sum(r[k] for r in runs) / len(runs), 6) for k in keys}

