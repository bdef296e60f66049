"""The workers' compute seconds of a simulated run, summed as the live workers report them.

A live worker reports per request the wall time of its compute (encode_s: its micro-batch's encoder call;
prefill_s and decode_s: the engine steps it was in, their forwards only, the loop around them not counted),
so summed over the requests these are request-weighted compute seconds: a step of 4 sequences counts 4
times. `ComputeMeter` sums the same from a simulation (Simulator(record_compute=True)): each forward's time
from the service without overheads, weighted by the requests in it. The two sums side by side give the host's
speed during a live run against the profile the simulation used (benchmarks/sim_fidelity_speed.py).

How much of a time-sliced processor's sharing counts is `stretched`: each forward counts its own length plus that
share of what the sharing added to it on the wall (0: its own length; 1: its wall length). Live timers see a
little of it: a worker whose step the other worker's turn interrupts reads a longer step, one the scheduler lets
finish first does not. On colocated_prefill's core 1 (two LLM workers time-slicing) the decode steps read
0.16-0.32 ms longer at full overlap while the requests' TPOT grew 1.8-2.0 ms on 1.9: the timers saw 0.11-0.21 of
the stretch in the quiet phases of 2026-12-06, 0.41-0.79 in the slow ones (benchmarks/timer_stretch.py,
benchmarks/results/sim_fidelity_s25/). Counted at 0, the stretch the timers did see read as a slower host and was
simulated twice; at 1, the simulated time-slicing took the host for faster than it was (session 24). The part of a
stretch the serving stack's jobs caused (sim_gpu._Lane.held_by_stack) can count at its own share, `stack_stretched`:
the stack's brief wake-ups preempt a worker mid-forward, and measured apart its timer saw 0.90-1.00 of what they
delayed it (benchmarks/timer_interrupts.py); by default it counts as the rest does.

With `window_s` the meter also sums the compute per window of simulated time (each forward in the window where it
ends), which a live run's requests give per window too: the host's speed over the run (sim_noise.HostTrace).

Per request it keeps what a live worker's timer reports as the request's decode_s: the forwards of every engine step
it decoded in (`decode_s`, by request id). Each engine keeps a running sum of what one decoding sequence is charged per
step; a sequence's decode_s is that sum when it finishes less the sum when it joined, so a step stays O(1) whatever
its batch. How widely these spread is the host's speed moment to moment (benchmarks/sim_fidelity_noise.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.planner.service import ServiceTimes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from coordinator.planner.sim_engine import Flight, StepPlan

STAGES = ("encode", "prefill", "decode")


class ComputeMeter:
    """Request-weighted compute seconds per stage (STAGES) of one simulated run."""

    def __init__(self, compute: ServiceTimes, stretched: float = 0.0, window_s: float = 0.0,
                 stack_stretched: float | None = None) -> None:
        for name, share in (("stretched", stretched), ("stack_stretched", stack_stretched)):
            if share is not None and not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} is the share of a time-sliced forward's stretch its timer sees, in [0, 1]; "
                                 f"got {share!r}")
        self.compute = compute
        """The run's service times without the serving stack's overheads (PerfModel.without_overheads)."""
        self.stretched = float(stretched)
        """The share of its stretch (wall / work - 1) a forward on a time-sliced processor counts with (`stretch`):
        0 at its own length, 1 at its wall length."""
        self.stack_stretched = self.stretched if stack_stretched is None else float(stack_stretched)
        """The same share for the part of the stretch the serving stack's jobs caused (None: `stretched`). The stack's
        brief wake-ups preempt a worker mid-forward, where another worker's turn mostly waits for the forward to end."""
        self.totals = dict.fromkeys(STAGES, 0.0)
        self.window_s = window_s
        """Seconds of simulated time per window of `windows`; 0: no windows."""
        self.windows: dict[int, dict[str, float]] = {}
        """Window index -> request-weighted compute seconds per stage of the forwards that ended in it."""
        self.decode_s: dict[int, float] = {}
        """Request id -> the compute of the engine steps it decoded in, as its worker's timer reports it (decode_s)."""
        self._charged: dict[str, float] = {}
        """Engine (node name) -> seconds one decoding sequence has been charged over all its steps so far. An encode
        node's engines share its name; only one of them decodes (the stealing engine; the other only prefills)."""
        self._joined: dict[int, float] = {}
        """Request id -> its engine's _charged when it started decoding there."""

    def stretch(self, started: float, now: float, work_s: float, by_stack_s: float = 0.0) -> float:
        """How much longer than its work a job that ran from `started` to `now` counts, as a live timer around it
        sees it: 1 + (stretched x the time other workers added + stack_stretched x `by_stack_s`, what the stack's
        lanes added) / work; 1.0 with both shares 0."""
        if work_s <= 0 or not (self.stretched or self.stack_stretched):
            return 1.0
        added = max(0.0, now - started - work_s)
        by_stack = min(max(0.0, by_stack_s), added)
        return 1.0 + (self.stretched * (added - by_stack) + self.stack_stretched * by_stack) / work_s

    def add(self, stage: str, seconds: float, now: float) -> None:
        """Request-weighted compute seconds of `stage`, of forwards that ended at `now`."""
        self.totals[stage] += seconds
        if self.window_s:
            window = self.windows.setdefault(max(0, int(now // self.window_s)), dict.fromkeys(STAGES, 0.0))
            window[stage] += seconds

    def step(self, node: str, tier: str, plan: StepPlan, prefill_s: float, now: float, stretch: float = 1.0) -> None:
        """An engine step of `node` that ended at `now`: its forwards (`prefill_s`, timed by the caller on
        `compute`, and its decode; times `stretch`) count once for each sequence it prefills and once for each it
        decodes, as each is charged the whole step live."""
        decode = self.compute.decode_step_s(tier, plan.decodes, plan.decode_cost_context) if plan.decodes else 0.0
        forward = (prefill_s + decode) * stretch
        self.add("prefill", forward * len(plan.prefills), now)
        self.add("decode", forward * plan.decodes, now)
        if plan.decodes:
            self._charged[node] = self._charged.get(node, 0.0) + forward

    def decode_steps(self, node: str, forwards: list[float], batches: list[int], ends: list[float]) -> None:
        """Plain decode steps of `node` (a coast): each step's forward, its batch and when it ended."""
        for forward, batch, end in zip(forwards, batches, ends):
            self.add("decode", forward * batch, end)
        self._charged[node] = self._charged.get(node, 0.0) + sum(forwards)

    def joined(self, node: str, flights: Iterable[Flight]) -> None:
        """`flights` decode on `node` from its next step on (call before that step is metered)."""
        charged = self._charged.get(node, 0.0)
        for f in flights:
            self._joined[f.record.request.request_id] = charged

    def left(self, node: str, flights: Iterable[Flight]) -> None:
        """`flights` stopped decoding on `node` (their last step metered): their decode_s is what it charged them."""
        charged = self._charged.get(node, 0.0)
        for f in flights:
            start = self._joined.pop(f.record.request.request_id, None)
            if start is not None:
                self.decode_s[f.record.request.request_id] = charged - start
