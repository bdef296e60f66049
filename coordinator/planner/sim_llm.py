"""Simulated LLM engines on their GPUs: P, D and P+D nodes, and the engines encode nodes hold.

`Engine` times an EngineModel's steps with ServiceTimes and settles what each step produced (first
tokens, finishes, KV hand-offs). `LLMNode` steps its engine back to back while it has work.

Coasting (the simulator's main speed-up): most steps of a long decode only decode, admitting and
finishing no one. Such "plain" steps change nothing another node can observe (load, records), so an
engine runs a whole run of them at once, up to its next finisher (at most MAX_COAST_STEPS), with ONE
event at the end, keeping each step's end time. If something lands in the middle that the next step
would have seen (a request the engine can admit at once; for stolen work, a released micro-batch),
the coast is cut back to the boundary just after it, exactly where step-by-step simulation would have
acted on it; a request that must wait anyway (the batch is full) leaves the coast alone. Results are
the same as stepping each step through the event queue (`coast=False`), up to the order of events at
the very same instant, and every step keeps its own duration (hence TPOT).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from coordinator.planner.goodput import NodeUsage
from coordinator.planner.service import ServiceTimes
from coordinator.planner.sim_engine import EngineModel, Flight, StepPlan, StepResult
from coordinator.protocol.roles import LLMRole
from coordinator.planner.sim_events import EventQueue

if TYPE_CHECKING:
    from coordinator.planner.sim import Cluster
    from coordinator.planner.sim_gpu import CoreLane

MAX_COAST_STEPS = 32
"""Longest run of plain steps planned at once (bounds the end-time list)."""


class Engine:
    """An EngineModel on one node: times its steps with ServiceTimes and settles each step's records."""

    def __init__(self, cluster: Cluster, node: str, tier: str, host: str | None, role: LLMRole) -> None:
        self.cluster = cluster
        self.node = node
        self.tier = tier
        self.host = host
        limits = cluster.deployment.engine
        self.model = EngineModel(role, limits.max_num_seqs, limits.max_num_batched_tokens, limits.pad_to_longest)
        self._metered = (0.0, 0.0)
        """(start, work seconds) of the step running, for the compute meter (sim_compute.py)."""

    def next_step(self, now: float) -> tuple[StepPlan, float, float]:
        """The next step and its prefill and decode seconds at the full GPU."""
        plan = self.model.schedule()
        svc = self.cluster.service
        prefill = self._prefill_s(plan) if plan.prefills else 0.0
        decode = svc.decode_step_s(self.tier, plan.decodes, plan.decode_cost_context) if plan.decodes else 0.0
        if plan.admitted and (cost := self.admit_s() * plan.admitted):
            if plan.prefills:
                prefill += cost
            else:
                decode += cost
        for f in plan.prefills:
            f.record.prefill_start = now
        if (meter := self.cluster.meter) is not None:  # a started step always completes (finish_step meters it)
            self._metered = (now, prefill + decode)
            meter.joined(self.node, plan.joined)
        return plan, prefill, decode

    def admit_s(self) -> float:
        """Seconds the engine spends per request it admits, between steps (ServiceTimes' optional admit_s; 0
        where the service does not time admissions)."""
        admit = getattr(self.cluster.service, "admit_s", None)
        return admit(self.tier, self.model.role) if admit is not None else 0.0

    def _prefill_s(self, plan: StepPlan, svc: ServiceTimes | None = None) -> float:
        """The step's prefill: its sequences each with their own attention (ServiceTimes.prefill_batch_s,
        padded to the longest when the engine pads) where the service times batches, else all its tokens
        as one prompt (plan.prefill_cost_tokens). On `svc`, by default the cluster's."""
        svc = svc or self.cluster.service
        batch = getattr(svc, "prefill_batch_s", None)  # optional, like under_load
        if batch is None or len(plan.prefills) == 1:
            return svc.prefill_s(self.tier, plan.prefill_cost_tokens)
        lengths = [f.prompt for f in plan.prefills]
        if self.model.padded:
            lengths = [max(lengths)] * len(lengths)
        return batch(self.tier, lengths)

    def finish_step(self, plan: StepPlan, now: float, by_stack_s: float = 0.0) -> StepResult:
        """The step ended at `now`; `by_stack_s`: how much longer the stack's jobs beside it made it (metered)."""
        if (meter := self.cluster.meter) is not None:
            started, work = self._metered
            meter.step(self.node, self.tier, plan, self._prefill_s(plan, meter.compute) if plan.prefills else 0.0,
                       now, meter.stretch(started, now, work, by_stack_s))
        out = self.model.complete(plan)
        if meter is not None:
            meter.joined(self.node, out.decoding)
            meter.left(self.node, out.finished)
        stack = self.cluster.stack
        stack.tokens(plan.decodes + len(out.first_tokens), 1, self.node)
        for f in out.first_tokens:
            f.record.first_token = now
            stack.first_token(f, self.node)
        for f in out.finished:
            f.record.finish = now
            if not f.record.decode_node:
                f.record.decode_node = self.node
            stack.finished(f, self.node)
        for f in out.handoffs:
            self.cluster.hand_off_kv(f, self.tier, self.host, now)
        return out


class Coast:
    """A run of plain decode steps of one engine, planned at once, with one event where it ends."""

    def __init__(self, engine: Engine, events: EventQueue,
                 on_end: Callable[[list[float], list[float]], None]) -> None:
        self.engine = engine
        self.events = events
        self.on_end = on_end
        """Called at the end of the last step kept, with each kept step's end time and seconds."""
        self._first = 0
        self._ends: list[float] = []
        self._seconds: list[float] = []
        self._batches: list[int] = []
        """Tokens each kept step produces (its decode batch)."""
        self._compute: list[float] = []
        """With a compute meter (sim_compute.py): each kept step's forward without overheads."""
        self._cut = False
        self._version = 0

    @property
    def active(self) -> bool:
        return bool(self._ends)

    def start(self, now: float) -> bool:
        """Plan the plain steps from `now`, up to the engine's next finisher; False if the next step is not plain."""
        model, first, t = self.engine.model, self.engine.model.step_index, now
        decode_s, tier = self.engine.cluster.service.decode_step_s, self.engine.tier
        ends, seconds, batches = self._ends, self._seconds, self._batches
        meter = self.engine.cluster.meter
        while len(ends) < MAX_COAST_STEPS:
            step = model.plain_decode_step()
            if step is None:
                break
            dt = decode_s(tier, step[0], step[1])
            t += dt
            ends.append(t)
            seconds.append(dt)
            batches.append(step[0])
            if meter is not None:
                self._compute.append(meter.compute.decode_step_s(tier, step[0], step[1]))
        if not ends:
            return False
        self._first, self._cut = first, False
        self._version += 1
        self.events.at(t, self._end, self._version)
        return True

    def cut(self, now: float) -> None:
        """Something changed at `now` that the next step must see: keep the steps up to the one running
        at `now`, forget the rest, and end at that step's end (the next step boundary)."""
        if self._cut:
            return
        kept = min(bisect_left(self._ends, now) + 1, len(self._ends))
        self.engine.model.rewind(self._first + kept)
        del self._ends[kept:], self._seconds[kept:], self._batches[kept:], self._compute[kept:]
        self._cut = True
        self._version += 1
        self.events.at(self._ends[-1], self._end, self._version)

    def _end(self, version: int) -> None:
        if version != self._version:
            return
        ends, seconds = self._ends, self._seconds
        self._ends, self._seconds = [], []
        self.engine.cluster.stack.tokens(sum(self._batches), len(self._batches), self.engine.node)  # the coast's tokens, relayed at its end
        if self._compute:
            self.engine.cluster.meter.decode_steps(self.engine.node, self._compute, self._batches, ends)
        self._batches, self._compute = [], []
        self.on_end(ends, seconds)


class LLMNode:
    """A P, D or P+D GPU: one engine stepping back to back while it has work."""

    def __init__(self, cluster: Cluster, usage: NodeUsage, host: str | None, role: LLMRole,
                 lane: CoreLane | None = None) -> None:
        self.cluster = cluster
        self.name, self.tier, self.host = usage.name, usage.tier, host
        self.usage = usage
        self.engine = Engine(cluster, usage.name, usage.tier, host, role)
        self.lane = lane
        """Its lane on a core it time-slices with other nodes' workers (sim_gpu.SharedCore); None: a GPU of its own."""
        self.coast = Coast(self.engine, cluster.events, self._coasted) if cluster.coast and lane is None else None
        """Not on a shared core: a coast's step ends are fixed when it starts, a shared core's are not."""
        self.incoming = 0
        """Requests routed here whose transfer has not landed yet."""
        self.reported_load = 0
        """`load` at its last heartbeat (Simulator.load_report_s)."""
        self._busy = False

    @property
    def load(self) -> int:
        return self.engine.model.load + self.incoming

    def receive(self, flight: Flight) -> None:
        """A transfer landed (event callback)."""
        self.incoming -= 1
        self.engine.model.add(flight)
        if self.coast is not None and self.coast.active:
            if self.engine.model.can_admit():  # else it waits behind a full batch: the coast stands
                self.coast.cut(self.cluster.events.now)  # admitted at the next step boundary
        elif not self._busy:
            self._step(self.cluster.events.now)

    def _step(self, now: float) -> None:
        plan, prefill, decode = self.engine.next_step(now)
        stages = self.usage.stage_busy_s
        stages["prefill"] += prefill
        stages["decode"] += decode
        self.usage.busy_s += prefill + decode
        self._busy = True
        if self.lane is not None:
            self.lane.run(prefill + decode, self._stepped, plan)
        else:
            self.cluster.events.at(now + prefill + decode, self._stepped, plan)

    def _stepped(self, plan: StepPlan) -> None:
        now = self.cluster.events.now
        self.engine.finish_step(plan, now, self.lane.held_by_stack if self.lane is not None else 0.0)
        if self.coast is not None and self.coast.start(now):
            return
        self._next(now)

    def _coasted(self, ends: list[float], seconds: list[float]) -> None:
        total = sum(seconds)
        self.usage.stage_busy_s["decode"] += total
        self.usage.busy_s += total
        self._next(self.cluster.events.now)

    def _next(self, now: float) -> None:
        if self.engine.model.has_work():
            self._step(now)
        else:
            self._busy = False
