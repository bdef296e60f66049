"""Processors shared by several jobs at once: an E+P GPU, and a CPU core time-sliced by several workers.

Each side is a lane holding at most one job (an encoder micro-batch, one engine step) measured in
seconds at the full processor (what ServiceTimes returns). A lane progresses at `speed`, its share of
the processor, and every start or finish re-divides it, so a job's finish time moves when another lane
starts or stops (processor sharing with piecewise-constant rates). `_LaneSet` does that bookkeeping;
the two processors differ only in how they divide.

SharedGPU: an E+P GPU shared by its encoder and its co-located prefill worker, SM partition by SM
partition. Shares, from SMPartition (the same object the encode worker uses):
- "static" / "dynamic": while a micro-batch is encoded, each side runs at allotted TPCs / total TPCs
  of the split chosen for THAT micro-batch (per-micro-batch masks, held until the batch ends; a
  dynamic split taken with no prefill backlog gives the prefill side nothing until the batch ends).
  With no micro-batch in flight the prefill side gets what `split(0, 0, backlog)` gives it: the whole
  GPU under "dynamic", its fixed share under "static" (static masks stay in place).
- "none": no masks. Two processes on one GPU without MPS time-slice, so we model processor sharing:
  each busy side gets half the GPU, a side alone gets all of it. Only in this mode can other jobs join
  (`lane(name)`: the serving stack on a CPU "E+P" core, sim_stack.py): k busy lanes each run at 1/k.
Linear scaling in TPCs is optimistic for memory-bound prefill (SMs do not partition HBM bandwidth).

SharedCore: one CPU core running the workers of several nodes (a local CPU cluster with more workers
than cores, each pinned: `Simulator(shared_cores=...)`). The OS scheduler time-slices the busy ones
fairly, so k busy lanes each run at 1/k: processor sharing again, at the scheduler's granularity
(milliseconds), which is finer than most jobs here.

Time-slicing is not free: every switch costs the process coming back its caches, so k >= 2 busy lanes
get `sharing` of the processor in all (each sharing/k; 1.0: perfect processor sharing). It applies to
processors that time-slice (SharedCore, an unpartitioned SharedGPU), not to SM partitions, which run
side by side. benchmarks/core_sharing.py measures it for two of the cluster's processes on one core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator.planner.goodput import NodeUsage
from coordinator.planner.sim_events import EventQueue
from coordinator.policies.sm_partition import SMPartition, TPCSplit


class _Lane:
    __slots__ = ("stage", "busy", "work_left", "speed", "since", "started", "version", "scheduled", "done", "first",
                 "stack", "stack_part", "held_by_stack")

    def __init__(self, stage: str, first: bool = False, stack: bool = False) -> None:
        self.stage = stage
        self.first = first
        """Runs before the other lanes while busy (lanes with `first` share the processor among themselves;
        the others wait): a job made of brief wake-ups, which the OS scheduler lets preempt a process that
        computes continuously (sim_stack.py, Simulator.stack_preempts)."""
        self.busy = False
        self.work_left = 0.0
        """Seconds at the full processor still to run."""
        self.speed = 0.0
        self.since = 0.0
        """When work_left was last brought up to date."""
        self.started = 0.0
        self.version = 0
        self.scheduled = False
        """A finish event for the current version is in the queue."""
        self.done: tuple[Callable[[Any], None], Any] | None = None
        self.stack = stack
        """A lane of the serving stack's jobs (sim_stack.py), not a worker's."""
        self.stack_part = 0.0
        """Of what the other busy lanes take from this one now, the stack lanes' part."""
        self.held_by_stack = 0.0
        """Seconds the current (or last) job has run longer than its work because stack lanes ran beside it."""

    def hold(self, now: float) -> None:
        """Bring work_left and held_by_stack up to `now` at the current speed."""
        dt = now - self.since
        self.work_left = max(0.0, self.work_left - dt * self.speed)
        self.held_by_stack += dt * max(0.0, 1.0 - self.speed) * self.stack_part
        self.since = now


class _LaneSet:
    """Lanes on one processor; subclasses say how it is divided (`_speeds`) and what a finish records."""

    def __init__(self, events: EventQueue, name: str, sharing: float = 1.0) -> None:
        if not 0.0 < sharing <= 1.0:
            raise ValueError(f"{name}: sharing must be in (0, 1], got {sharing!r}")
        self.events = events
        self.name = name
        self.sharing = sharing
        """The share of the processor k >= 2 busy time-slicing lanes get in all (module docstring)."""
        self.lanes: list[_Lane] = []
        self.has_stack = False
        """A stack lane is here: only then is a lane's stretch split between the stack and the rest (_Lane.stack_part)."""
        self.watchers: list[Callable[[], None]] = []
        """Called whenever a lane here starts or stops (sim_stack: floating jobs look for a freer core)."""

    def _speeds(self) -> list[float]:
        """Each lane's share of the processor now, in lane order."""
        raise NotImplementedError

    def _finished(self, lane: _Lane, now: float) -> None:
        """Bookkeeping when `lane`'s job ends, before the shares are recomputed."""

    def _start(self, lane: _Lane, work_s: float, done: Callable[[Any], None], arg: Any) -> None:
        if lane.busy:
            raise RuntimeError(f"{self.name}: {lane.stage} lane is already busy")
        now = self.events.now
        lane.busy, lane.work_left, lane.speed, lane.since, lane.started = True, work_s, 0.0, now, now
        lane.scheduled, lane.done, lane.held_by_stack = False, (done, arg), 0.0
        self._reflow(now)
        self._changed()

    def _changed(self) -> None:
        for watch in self.watchers:
            watch()

    def _stop(self, lane: _Lane) -> tuple[float, Callable[[Any], None], Any]:
        """Take a lane's job away unfinished: (seconds of work left, its done, its arg); it never finishes here."""
        now = self.events.now
        lane.hold(now)
        lane.busy = lane.scheduled = False
        lane.version += 1
        done, lane.done = lane.done, None
        assert done is not None
        self._reflow(now)
        self._changed()
        return lane.work_left, done[0], done[1]

    def _reflow(self, now: float) -> None:
        busy = [lane for lane in self.lanes if lane.busy] if self.has_stack else []
        first = [lane for lane in busy if lane.first]
        for lane, speed in zip(self.lanes, self._speeds()):
            if not lane.busy:
                continue
            lane.hold(now)
            if self.has_stack:
                # who takes the processor from it next: the lanes that run first (it waits), else every other busy lane
                takers = first if first and not lane.first else [o for o in (first or busy) if o is not lane]
                lane.stack_part = sum(o.stack for o in takers) / len(takers) if takers else 0.0
            if speed == lane.speed and lane.scheduled:
                continue
            lane.speed = speed
            lane.version += 1
            lane.scheduled = speed > 0.0
            if lane.scheduled:
                self.events.at(now + lane.work_left / speed, self._finish, (lane, lane.version))

    def _finish(self, arg: tuple[_Lane, int]) -> None:
        lane, version = arg
        if version != lane.version or not lane.busy:
            return
        now = self.events.now
        lane.hold(now)
        lane.busy = lane.scheduled = False
        self._finished(lane, now)
        done, lane.done = lane.done, None
        self._reflow(now)
        self._changed()
        assert done is not None
        done[0](done[1])


class SharedGPU(_LaneSet):
    """Encoder lane + local-prefill lane on one GPU; see the module docstring for the shares."""

    def __init__(self, events: EventQueue, partition: SMPartition, usage: NodeUsage, sharing: float = 1.0) -> None:
        super().__init__(events, usage.name, sharing)
        self.partition = partition
        self.usage = usage
        self.encoder = _Lane("encode")
        self.prefill = _Lane("prefill")
        self.lanes = [self.encoder, self.prefill]
        self._split: TPCSplit | None = None
        self._idle_split = partition.split(0, 0, 1)
        if partition.config.mode != "none" and self._idle_split.prefill_tpcs == 0:
            raise ValueError(f"an E+P GPU with total_tpcs={partition.total_tpcs} and mode="
                             f"{partition.config.mode!r} leaves its prefill worker no TPC; give it more TPCs")
        self._busy_since = 0.0
        self._guests: list[_Lane] = []

    def lane(self, name: str, first: bool = False, stack: bool = False) -> CoreLane:
        """A lane for a job other than the node's two workers (partition mode "none" only: masks would
        leave it no SMs); its time is not the node's usage. `first`: it preempts the others (_Lane.first);
        `stack`: it runs the serving stack's jobs (_Lane.stack)."""
        if self.partition.config.mode != "none":
            raise ValueError(f"{self.name}: only an unpartitioned (mode='none') E+P processor takes other jobs' "
                             f"lanes; this one has mode={self.partition.config.mode!r}")
        lane = _Lane(name, first, stack)
        self.has_stack |= stack
        self._guests.append(lane)
        self.lanes.append(lane)
        return CoreLane(self, lane)

    def start_encode(self, work_s: float, requests: int, tokens: int, backlog_tokens: int,
                     done: Callable[[Any], None], arg: Any) -> None:
        """Encode a micro-batch; the split is chosen now, for this batch, from the prefill backlog."""
        self._split = self.partition.split(requests, tokens, backlog_tokens)
        self._start(self.encoder, work_s, done, arg)

    def start_prefill(self, work_s: float, done: Callable[[Any], None], arg: Any) -> None:
        self._start(self.prefill, work_s, done, arg)

    def _start(self, lane: _Lane, work_s: float, done: Callable[[Any], None], arg: Any) -> None:
        if lane in (self.encoder, self.prefill) and not (self.encoder.busy or self.prefill.busy):
            self._busy_since = self.events.now
        super()._start(lane, work_s, done, arg)

    def _speeds(self) -> list[float]:
        enc = self.encoder.busy
        if self.partition.config.mode == "none":
            return _shares(self.lanes, self.sharing)
        split = self._split if enc and self._split is not None else self._idle_split
        total = self.partition.total_tpcs
        return [split.encoder_tpcs / total, split.prefill_tpcs / total]

    def _finished(self, lane: _Lane, now: float) -> None:
        if lane in self._guests:
            return
        self.usage.stage_busy_s[lane.stage] += now - lane.started
        if not (self.encoder.busy or self.prefill.busy):
            self.usage.busy_s += now - self._busy_since
        if lane is self.encoder:
            self._split = None


class CoreLane:
    """One job stream on a shared processor (a node's worker on a SharedCore, the stack on a core or an
    unpartitioned E+P processor): runs one job at a time, at its share of the processor."""

    __slots__ = ("core", "lane")

    def __init__(self, core: _LaneSet, lane: _Lane) -> None:
        self.core = core
        self.lane = lane

    @property
    def busy(self) -> bool:
        return self.lane.busy

    @property
    def held_by_stack(self) -> float:
        """Seconds the current (or last finished) job ran longer than its work because of the stack's lanes."""
        return self.lane.held_by_stack

    def run(self, work_s: float, done: Callable[[Any], None], arg: Any) -> None:
        """Run `work_s` seconds of work (at the whole core); `done(arg)` when it is through."""
        self.core._start(self.lane, work_s, done, arg)

    def stop(self) -> tuple[float, Callable[[Any], None], Any]:
        """Take the running job off this lane (to run the rest elsewhere): (work left, done, arg)."""
        return self.core._stop(self.lane)


class SharedCore(_LaneSet):
    """A CPU core time-sliced by the workers pinned to it: k busy lanes each run at 1/k."""

    def lane(self, node: str, first: bool = False, stack: bool = False) -> CoreLane:
        """A lane for node `node`'s worker (its usage is the node's own business), or with `stack` for the serving
        stack's jobs (_Lane.stack); `first`: it preempts the others (_Lane.first)."""
        lane = _Lane(node, first, stack)
        self.has_stack |= stack
        self.lanes.append(lane)
        return CoreLane(self, lane)

    def _speeds(self) -> list[float]:
        return _shares(self.lanes, self.sharing)


def _shares(lanes: list[_Lane], sharing: float) -> list[float]:
    """Processor sharing among the busy lanes that run first (_Lane.first) if any is busy, else among all
    busy lanes: k of them each run at 1/k, or at sharing/k when k >= 2 time-slice; the rest wait (0)."""
    first = sum(lane.busy and lane.first for lane in lanes)
    if first:
        each = 1.0 if first == 1 else sharing / first
        return [each if lane.first else 0.0 for lane in lanes]
    busy = sum(lane.busy for lane in lanes)
    return [sharing / busy if busy > 1 else 1.0] * len(lanes)
