"""The serving stack's hops in the simulator: the coordinator between the client and the workers.

A live request pays two hops outside every worker (ttft_stages.py cuts TTFT at them): the way in
(client -> coordinator -> the encode worker's queue: HTTP, prompt building, dispatch) and the way out
(the first token -> the coordinator's relay -> the client; the last token takes the same way). A
service with `request_hops_s()` (PerfModel: a profile's request_latency_s split by its request_in_s)
gives their idle latencies; one with only `request_latency_s()` has it all on the way out.

Two models of them:
- delays (no stack cores): each hop is a fixed delay. The way in delays the request's arrival at its
  encode node, the way out the client's first and last token. Contention, if any, is the service's own
  business (PerfModel.under_load stretches the hops and the encoder, "encode_core").
- on cores (`Simulator(stack_cores={node: share, ...})`): the coordinator runs on the cores of those
  nodes' workers, as on a one-host CPU cluster, where it floats between cores (not pinned) and spends
  `share` of its CPU on each. Its hops are jobs of one event loop, first come first served: a hop of
  idle latency h runs h x share on each core in turn (at the whole core it takes h; while the workers
  there compute, longer), and waits behind earlier hops. The rest of the stack's CPU
  (`stack_cpu_s(tokens)` beyond its hops: relaying tokens, Redis, a load generator on the host) runs on
  a second lane of each core, split by the same shares: the per-token part as the tokens are produced
  (`tokens(n)` from the engines' steps), the per-request rest when the request finishes. The lanes take
  their share of a core from its workers (sim_gpu: k busy lanes each at 1/k), so the stack lowers the
  capacity of the workers beside it and its hops grow with load. An E+P node's (unpartitioned) processor
  takes the stack's lanes like a core. With `stack_placement="idlest"` each job runs whole on the core
  with the fewest other busy lanes as it starts (the OS waking a floating process on an idle core); the
  shares only break ties, and the split over the cores emerges from the load (cpu_by_core). With
  `stack_placement="load"` a core's busy workers count before the stack's own busy jobs there
  (Simulator.stack_placement).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coordinator.planner.service import ServiceTimes
from coordinator.planner.sim_engine import Flight
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import CoreLane

StackPlacement = Literal["share", "idlest", "float", "load"]
"""How the stack's jobs spread over its cores (Simulator.stack_placement)."""
STACK_LANES = ("stack hops", "stack")
"""The names of the stack's own lanes on a processor (Simulator._stack_cores); every other lane is a worker's."""


@dataclass(frozen=True)
class StackCore:
    """The stack's two lanes on one core and its share of the stack's CPU there."""

    hops: CoreLane
    """The coordinator's event loop while it runs on this core."""
    rest: CoreLane
    """The rest of the stack's CPU on this core (token relay, Redis, load generator)."""
    share: float
    """Fraction of the stack's CPU spent on this core; the shares of all its cores add up to 1."""
    node: str = ""
    """A node whose worker runs on this core (names the core in Stack.cpu_by_core)."""


def _others_busy(lane: CoreLane, by_load: bool = False) -> tuple[int, int]:
    """The busy lanes beside `lane` on its processor, as a key to order processors by: (busy workers, busy stack
    lanes) with `by_load` (a busy worker weighs before any number of the stack's jobs), else (0, all of them)."""
    workers = stack = 0
    for other in lane.core.lanes:  # on every placement and rebalance: no list built
        if other.busy and other is not lane.lane:
            if other.stage in STACK_LANES:
                stack += 1
            else:
                workers += 1
    return (workers, stack) if by_load else (0, workers + stack)


class _Fifo:
    """Jobs in arrival order, one at a time; each runs as pieces (work x share) on its lanes in turn,
    or ("idlest") whole on the lane whose processor has the fewest other busy lanes as it starts."""

    def __init__(self, pieces: Sequence[tuple[CoreLane, float]], idlest: bool = False, by_load: bool = False) -> None:
        self.pieces = [(lane, share) for lane, share in pieces if share > 0]
        self.idlest = idlest
        self.by_load = by_load
        """("idlest") Order the processors by their busy workers first, the stack's busy lanes only after
        (_others_busy; Simulator.stack_placement "load")."""
        self.jobs: deque[tuple[float, Callable[[Any], None] | None, Any, object]] = deque()
        self.busy = False
        self.charged: dict[str, float] = {}
        """Work run per processor (its name), in seconds at the whole processor."""
        self.running: CoreLane | None = None
        """("idlest") The lane the current job runs on."""

    def submit(self, work_s: float, done: Callable[[Any], None] | None, arg: Any = None,
               waker: object = None) -> None:
        """`waker`: ("idlest") the processor whose job woke this one: it runs there when no core has fewer
        other busy lanes (Stack's wake_affine)."""
        self.jobs.append((work_s, done, arg, waker))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        self.busy = bool(self.jobs)
        if self.jobs:
            self._piece((0, *self.jobs.popleft()))

    def _piece(self, job: tuple[int, float, Callable[[Any], None] | None, Any, object]) -> None:
        i, work, done, arg, waker = job
        if self.idlest:
            lane = self._idlest(waker)
            self._charge(lane, work)
            self.running = lane
            lane.run(work, self._ran, (len(self.pieces) - 1, work, done, arg, waker))
            return
        lane, share = self.pieces[i]
        self._charge(lane, work * share)
        lane.run(work * share, self._ran, (i, work, done, arg, waker))

    def _idlest(self, waker: object = None) -> CoreLane:
        """The lane whose processor has the fewest other busy lanes; ties: the waker's processor, then the
        larger share."""
        return min(self.pieces, key=lambda p: (_others_busy(p[0], self.by_load), p[0].core is not waker, -p[1]))[0]

    def migrate(self) -> None:
        """("idlest") Move the running job to a core with fewer other busy lanes than its own, if there is
        one: the OS pulls a runnable floating process onto a core that has less to run (load balancing),
        so it does not stay time-sliced with a pinned worker while another of its cores has room."""
        lane = self.running
        if lane is None or not lane.busy:
            return
        best = self._idlest()
        if best is lane or _others_busy(best, self.by_load) >= _others_busy(lane, self.by_load):
            return
        left, done, arg = lane.stop()
        self._charge(lane, -left)
        self._charge(best, left)
        self.running = best
        best.run(left, done, arg)

    def _charge(self, lane: CoreLane, work: float) -> None:
        self.charged[lane.core.name] = self.charged.get(lane.core.name, 0.0) + work

    def _ran(self, job: tuple[int, float, Callable[[Any], None] | None, Any, object]) -> None:
        i, work, done, arg, waker = job
        self.running = None
        if i + 1 < len(self.pieces):
            self._piece((i + 1, work, done, arg, waker))
            return
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
    """The coordinator's two hops for every request, as delays or on cores (module docstring)."""

    def __init__(self, events: EventQueue, service: ServiceTimes, cores: Sequence[StackCore] = (),
                 idlest: bool = False, floating: bool = False, relay_per_step: bool = False, by_load: bool = False,
                 wakers: Mapping[str, object] | None = None, loop_share: float = 0.0) -> None:
        self.events = events
        if not 0.0 <= loop_share <= 1.0:
            raise ValueError(f"loop_share must be in [0, 1], got {loop_share!r}")
        self.loop_share = loop_share
        """(On cores) Share of the stack's relay and per-request CPU that is the coordinator's own: it runs in
        the coordinator's one event loop, the hops' queue, so a hop waits behind it (and it behind a hop); the
        rest (Redis, the client) runs beside it. 0: all of it beside the hops."""
        self.wakers = dict(wakers or {})
        """("idlest", wake-affine) Node -> its worker's processor: the stack's work a node's event wakes (its
        tokens' relay, the way out of its first and last token, the finished request's rest) prefers that
        processor when no core has fewer other busy lanes. Empty: ties go to the larger share."""
        self.relay_per_step = relay_per_step
        """Charge the token relay's CPU once per engine step that published tokens, not per token."""
        self.way_in_s, self.way_out_s = hop_times(service)
        cpu = getattr(service, "stack_cpu_s", None)
        per_request = cpu(0) if cpu is not None else 0.0
        self.token_cpu_s = (cpu(1) - per_request) if cpu is not None else 0.0
        """Stack CPU per output token (the relay), charged as the engines produce the tokens."""
        self.request_cpu_s = max(0.0, per_request - self.way_in_s - 2 * self.way_out_s)
        """Stack CPU per request beyond its hops, charged when it finishes (a hop beyond the profile's
        per-request CPU is not taken from the tokens' share)."""
        self._hops = _Fifo([(c.hops, c.share) for c in cores], idlest, by_load) if cores else None
        """The coordinator's event loop: hop jobs in order; None: hops are plain delays."""
        self._node_of = {c.hops.core.name: c.node for c in cores}
        self._rest = [_Fifo([(c.rest, c.share)]) for c in cores] if not idlest else (
            [_Fifo([(c.rest, c.share) for c in cores], idlest, by_load)] if cores else [])
        """The stack's other CPU, one queue per core ("idlest": one queue over all of them)."""
        self._rebalancing = False
        if floating and idlest and len(cores) > 1:
            for proc in {id(c.hops.core): c.hops.core for c in cores}.values():
                proc.watchers.append(self._lanes_changed)

    def _lanes_changed(self) -> None:
        """A lane on one of the stack's cores started or stopped: once everything due at this instant has
        run (a worker that finished a step starts its next one at the same instant), let the floating jobs
        move to a freer core (_Fifo.migrate)."""
        if not self._rebalancing:
            self._rebalancing = True
            self.events.at(self.events.now, self._rebalance)

    def _rebalance(self, _: object = None) -> None:
        self._rebalancing = False
        for fifo in ([self._hops] if self._hops else []) + self._rest:
            fifo.migrate()

    def cpu_by_core(self) -> dict[str, float]:
        """Stack CPU seconds run on each core so far (StackCore.node names it), hops included."""
        out: dict[str, float] = {}
        for fifo in ([self._hops] if self._hops else []) + self._rest:
            for name, work in fifo.charged.items():
                node = self._node_of[name]
                out[node] = out.get(node, 0.0) + work
        return out

    def way_in(self, flight: Flight, then: Callable[[Flight], None]) -> None:
        """The request reaches the coordinator now; `then(flight)` once the encode side has it."""
        self._hop(self.way_in_s, then, flight)

    def first_token(self, flight: Flight, node: str = "") -> None:
        """The first token exists now (record.first_token), on node `node`: the client gets it after the
        way out."""
        self._hop(self.way_out_s, self._first_delivered, flight, node)

    def tokens(self, n: int, steps: int = 1, node: str = "") -> None:
        """Node `node`'s engine produced `n` tokens now, in `steps` steps: the stack's CPU for relaying them,
        per token, or with `relay_per_step` per step that published any (module docstring)."""
        self._charge((min(n, steps) if self.relay_per_step else n) * self.token_cpu_s, node)

    def finished(self, flight: Flight, node: str = "") -> None:
        """The last token exists now (record.finish), on node `node`: relayed like the first; the rest of
        the stack's per-request CPU follows on its own lanes."""
        self._hop(self.way_out_s, self._last_delivered, flight, node)
        self._charge(self.request_cpu_s, node)

    def _charge(self, work_s: float, node: str = "") -> None:
        if work_s <= 0:
            return
        waker = self.wakers.get(node)
        if self._hops is not None and self.loop_share > 0:
            self._hops.submit(work_s * self.loop_share, None, None, waker)
            work_s *= 1.0 - self.loop_share
            if work_s <= 0:
                return
        for fifo in self._rest:
            fifo.submit(work_s, None, None, waker)

    def _hop(self, work_s: float, then: Callable[[Flight], None], flight: Flight, node: str = "") -> None:
        if self._hops is not None:
            self._hops.submit(work_s, then, flight, self.wakers.get(node))
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
