"""The workers' compute seconds of a simulated run, summed as the live workers report them.

A live worker reports per request the wall time of its compute (encode_s: its micro-batch's encoder call;
prefill_s and decode_s: the engine steps it was in, their forwards only, the loop around them not counted),
so summed over the requests these are request-weighted compute seconds: a step of 4 sequences counts 4
times. `ComputeMeter` sums the same from a simulation (Simulator(record_compute=True)): each forward's time
from the service without overheads, weighted by the requests in it. The two sums side by side give the host's
speed during a live run against the profile the simulation used (benchmarks/sim_fidelity_speed.py).

By default each forward counts at its own length, not stretched where the simulation time-slices its
processor with another worker's. At the fidelity runs' rates the live timers saw little of that sharing: on
2026-12-06 the two LLM workers time-slicing colocated_prefill's core 1 reported decode steps of 1.51-1.68 ms,
as epd's decode worker alone on its core (1.51-1.61), and the encoder beside a prefill worker 0.94-1.05x its
profiled call (benchmarks/results/sim_fidelity_s23/). They do see it when both workers decode without a pause
(steps 1.2-1.9x their length alone; benchmarks/worker_cpu.py --pair), so `stretched` counts each forward at
its wall length instead (wall / work of its step); on the fidelity records that reading took the host for
faster than it was (benchmarks/results/sim_fidelity_s24/), and it stays off there.

With `window_s` the meter also sums the compute per window of simulated time (each forward in the window where it
ends), which a live run's requests give per window too: the host's speed over the run (sim_noise.HostTrace).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.planner.service import ServiceTimes

if TYPE_CHECKING:
    from coordinator.planner.sim_engine import StepPlan

STAGES = ("encode", "prefill", "decode")


class ComputeMeter:
    """Request-weighted compute seconds per stage (STAGES) of one simulated run."""

    def __init__(self, compute: ServiceTimes, stretched: bool = False, window_s: float = 0.0) -> None:
        self.compute = compute
        """The run's service times without the serving stack's overheads (PerfModel.without_overheads)."""
        self.stretched = stretched
        """Count each forward at its wall length where the simulation time-slices its processor (`stretch`);
        False: at its own length."""
        self.totals = dict.fromkeys(STAGES, 0.0)
        self.window_s = window_s
        """Seconds of simulated time per window of `windows`; 0: no windows."""
        self.windows: dict[int, dict[str, float]] = {}
        """Window index -> request-weighted compute seconds per stage of the forwards that ended in it."""

    def stretch(self, started: float, now: float, work_s: float) -> float:
        """How much longer than its work a job that ran from `started` to `now` took (wall / work), as a live
        timer around it sees it; 1.0 unless `stretched`."""
        return (now - started) / work_s if self.stretched and work_s > 0 else 1.0

    def add(self, stage: str, seconds: float, now: float) -> None:
        """Request-weighted compute seconds of `stage`, of forwards that ended at `now`."""
        self.totals[stage] += seconds
        if self.window_s:
            window = self.windows.setdefault(max(0, int(now // self.window_s)), dict.fromkeys(STAGES, 0.0))
            window[stage] += seconds

    def step(self, tier: str, plan: StepPlan, prefill_s: float, now: float, stretch: float = 1.0) -> None:
        """An engine step that ended at `now`: its forwards (`prefill_s`, timed by the caller on `compute`, and its
        decode; times `stretch`) count once for each sequence it prefills and once for each it decodes, as each is
        charged the whole step live."""
        decode = self.compute.decode_step_s(tier, plan.decodes, plan.decode_cost_context) if plan.decodes else 0.0
        forward = (prefill_s + decode) * stretch
        self.add("prefill", forward * len(plan.prefills), now)
        self.add("decode", forward * plan.decodes, now)
