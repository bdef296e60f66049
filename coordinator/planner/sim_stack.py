"""The serving stack's hops in the simulator: the coordinator between the client and the workers.

A live request pays two hops outside every worker (ttft_stages.py cuts TTFT at them): the way in
(client -> coordinator -> the encode worker's queue: HTTP, prompt building, dispatch) and the way out
(the first token -> the coordinator's relay -> the client; the last token takes the same way). A
service with `request_hops_s()` (PerfModel: a profile's request_latency_s split by its request_in_s)
gives their idle latencies; one with only `request_latency_s()` has it all on the way out.

Two models of them:
- delays (no stack core): each hop is a fixed delay. The way in delays the request's arrival at its
  encode node, the way out the client's first and last token. Contention, if any, is the service's own
  business (PerfModel.under_load stretches the hops and the encoder, "encode_core").
- on a core (`Simulator(stack_core=node)`): the coordinator runs on the core of that node's worker, as
  on a one-host CPU cluster. Its hops are jobs on one lane of that core, first come first served (one
  event loop): a hop takes its idle latency at the whole core, longer while the worker computes and
  behind earlier hops. The rest of the stack's CPU per request (`stack_cpu_s(tokens)` beyond its hops:
  relaying every token, Redis, a load generator on the host) runs on a second lane once the request
  finishes. Both lanes take their share of the core from the worker (sim_gpu.SharedCore: k busy lanes
  each at 1/k), so the stack lowers the capacity of the worker beside it and its hops grow with load.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from coordinator.planner.service import ServiceTimes
from coordinator.planner.sim_engine import Flight
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import CoreLane


class _Fifo:
    """Jobs through one core lane, one at a time, in arrival order."""

    def __init__(self, lane: CoreLane) -> None:
        self.lane = lane
        self.jobs: deque[tuple[float, Callable[[Any], None] | None, Any]] = deque()

    def submit(self, work_s: float, done: Callable[[Any], None] | None, arg: Any = None) -> None:
        self.jobs.append((work_s, done, arg))
        if not self.lane.busy:
            self._next()

    def _next(self) -> None:
        if self.jobs:
            work, done, arg = self.jobs.popleft()
            self.lane.run(work, self._ran, (done, arg))

    def _ran(self, job: tuple[Callable[[Any], None] | None, Any]) -> None:
        done, arg = job
        self._next()
        if done is not None:
            done(arg)


def hop_times(service: ServiceTimes) -> tuple[float, float]:
    """(way in, way out) idle seconds per request from a service that knows them; (0, 0) otherwise."""
    hops = getattr(service, "request_hops_s", None)  # optional: ServiceTimes need not have it
    if hops is not None:
        return hops()
    latency = getattr(service, "request_latency_s", None)
    return 0.0, (latency() if latency is not None else 0.0)


class Stack:
    """The coordinator's two hops for every request, as delays or on a core (module docstring)."""

    def __init__(self, events: EventQueue, service: ServiceTimes,
                 lanes: tuple[CoreLane, CoreLane] | None = None) -> None:
        self.events = events
        self.way_in_s, self.way_out_s = hop_times(service)
        cpu = getattr(service, "stack_cpu_s", None)
        self._cpu_s: Callable[[int], float] = cpu if cpu is not None else (lambda tokens: 0.0)
        self._hops = _Fifo(lanes[0]) if lanes else None
        """The coordinator's event loop: hop jobs in order; None: hops are plain delays."""
        self._rest = _Fifo(lanes[1]) if lanes else None
        """The stack's other CPU per request, beside the hops."""

    def way_in(self, flight: Flight, then: Callable[[Flight], None]) -> None:
        """The request reaches the coordinator now; `then(flight)` once the encode side has it."""
        self._hop(self.way_in_s, then, flight)

    def first_token(self, flight: Flight) -> None:
        """The first token exists now (record.first_token): the client gets it after the way out."""
        self._hop(self.way_out_s, self._first_delivered, flight)

    def finished(self, flight: Flight) -> None:
        """The last token exists now (record.finish): relayed like the first; the rest of the stack's
        CPU for the request follows on its own lane."""
        self._hop(self.way_out_s, self._last_delivered, flight)
        if self._rest is not None:
            spare = self._cpu_s(flight.record.request.output_tokens) - self.way_in_s - 2 * self.way_out_s
            if spare > 0:
                self._rest.submit(spare, None)

    def _hop(self, work_s: float, then: Callable[[Flight], None], flight: Flight) -> None:
        if self._hops is not None:
            self._hops.submit(work_s, then, flight)
        elif work_s > 0:
            self.events.at(self.events.now + work_s, then, flight)
        else:
            then(flight)

    def _first_delivered(self, flight: Flight) -> None:
        r = flight.record
        r.to_client = self.events.now - r.first_token
        r.first_token = self.events.now

    def _last_delivered(self, flight: Flight) -> None:
        flight.record.finish = self.events.now
