"""A simulated encode node (E, E+P), driving the policy objects as the live runtime does.

An encode node does what coordinator/dispatch.py and encode_node/worker.py do live, at event times:
each arrival is `observe`d by its BatchPolicy and the policy is `decide`d at once; the next
`next_deadline` arms one timer (a newer one supersedes it). Every Release becomes one micro-batch
on the node's FIFO of pending batches, encoded whole in one forward (the live worker reads one stream
entry per forward). After a batch, each request is offered to WorkStealing.should_keep (E nodes with
stealing), else routed by the node's OffloadRouter: local prefill (E+P) or a remote P / P+D node.

An E node with stealing runs the worker loop of coordinator/policies/work_stealing.py on one GPU:
    if may_step: one step of the local combined engine; elif a batch waits: encode it; else idle.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from coordinator.planner.goodput import NodeUsage
from coordinator.planner.sim_engine import Flight, StepPlan
from coordinator.planner.sim_gpu import CoreLane, SharedGPU
from coordinator.planner.sim_llm import Coast, Engine
from coordinator.policies.base import Arrival, BatchPolicy
from coordinator.policies.offload import OffloadRouter
from coordinator.policies.work_stealing import WorkStealing

if TYPE_CHECKING:
    from coordinator.planner.sim import Cluster


class EncodeNode:
    """An E or E+P GPU: dispatch policy, encoder, offload router; a local prefill engine on E+P,
    work stealing (a local combined engine) on E."""

    def __init__(self, cluster: Cluster, usage: NodeUsage, host: str | None, policy: BatchPolicy,
                 router: OffloadRouter, gpu: SharedGPU | None, stealing: WorkStealing | None,
                 lane: CoreLane | None = None) -> None:
        self.cluster = cluster
        self.name, self.tier, self.host = usage.name, usage.tier, host
        self.usage = usage
        self.policy = policy
        self.router = router
        self.gpu = gpu
        """E+P only: the GPU shared with the local prefill engine."""
        self.local = Engine(cluster, self.name, self.tier, host, "prefill") if gpu is not None else None
        self.stealing = stealing
        self.stolen = Engine(cluster, self.name, self.tier, host, "combined") if stealing is not None else None
        self.lane = lane
        """E only: its lane on a core it time-slices with other nodes' workers (sim_gpu.SharedCore)."""
        self.coast = (Coast(self.stolen, cluster.events, self._stolen_coasted)
                      if stealing is not None and cluster.coast and lane is None else None)
        """Runs of plain stolen decode steps (sim_llm.py); cut short by a released micro-batch."""
        self.queue: deque[Flight] = deque()
        """Arrivals the policy has not released yet (the dispatcher's FIFO)."""
        self.pending: deque[list[Flight]] = deque()
        """Released micro-batches waiting for the encoder (the worker's job stream)."""
        self.held = 0
        """Requests here and not yet encoded: what least-loaded encode routing compares."""
        self._timer_version = 0
        self._armed: float | None = None
        self._busy = False
        """E only: the GPU runs an encoder batch or a stolen step."""
        self._local_step_tokens = 0
        self._encode_work = 0.0
        """Seconds of work of the micro-batch being encoded (one at a time), for the compute meter."""
        if stealing is not None:
            stealing.observe_encode_queue(0, 0.0)

    @property
    def load(self) -> int:
        return self.held

    # --- dispatch (coordinator/dispatch.py) ---------------------------------------------------

    def arrive(self, flight: Flight) -> None:
        now = self.cluster.events.now
        flight.record.encode_node = self.name
        self.held += 1
        self.queue.append(flight)
        self.policy.observe(Arrival(str(flight.record.request.request_id)), now)
        self._poll(now)

    def _poll(self, now: float) -> None:
        queue = self.queue
        for release in self.policy.decide(now):
            batch = [queue.popleft() for _ in range(min(release.count, len(queue)))]
            if batch:
                self._release(batch, now)
        deadline = self.policy.next_deadline(now)
        if deadline != self._armed:
            self._timer_version += 1
            self._armed = deadline
            if deadline is not None:
                self.cluster.events.at(max(deadline, now), self._timer, self._timer_version)

    def _timer(self, version: int) -> None:
        if version == self._timer_version:
            self._armed = None
            self._poll(self.cluster.events.now)

    def _release(self, batch: list[Flight], now: float) -> None:
        for f in batch:
            f.record.released = now
        self.pending.append(batch)
        if self.stealing is not None:
            self.stealing.observe_encode_queue(len(self.pending), now)
        if self.coast is not None and self.coast.active:
            self.coast.cut(now)  # the encoder goes next, after the stolen step in progress
        self._kick(now)

    # --- the GPU --------------------------------------------------------------------------------

    def _kick(self, now: float) -> None:
        """Start the next piece of work if the encoder (E: the whole GPU) is free."""
        if self.gpu is not None:
            if not self.gpu.encoder.busy and self.pending:
                self._encode(now)
            return
        if self._busy:
            return
        if self.stealing is not None and self.stealing.may_step(now):
            if self.coast is not None and self.coast.start(now):
                self._busy = True  # may_step stays True at each of its boundaries: nothing waits, nothing finishes
            else:
                self._stolen_step(now)
        elif self.pending:
            self._encode(now)

    def _encode(self, now: float) -> None:
        batch = self.pending.popleft()
        if self.stealing is not None:
            self.stealing.observe_encode_queue(len(self.pending), now)
        for f in batch:
            f.record.encode_start = now
            f.record.encode_batch = len(batch)
        work = self.cluster.encode_s(self.tier, batch)
        self._encode_work = work
        if self.gpu is not None:
            tokens = sum(f.record.request.embedding_tokens for f in batch)
            backlog = self.local.model.waiting_tokens + self._local_step_tokens
            self.gpu.start_encode(work, len(batch), tokens, backlog, self._encoded, batch)
            return
        self._busy = True
        self.usage.stage_busy_s["encode"] += work
        self.usage.busy_s += work
        self._run(now, work, self._encoded, batch)

    def _encoded(self, batch: list[Flight]) -> None:
        now = self.cluster.events.now
        self._busy = False
        self.held -= len(batch)
        ws = self.stealing
        if ws is not None:
            ws.observe_remote_load(self.cluster.min_remote_load(), now)
        has_local = self.local is not None
        if (meter := self.cluster.meter) is not None:
            stretch = meter.stretch(batch[0].record.encode_start, now, self._encode_work, self._held_by_stack("encode"))
            meter.add("encode", self.cluster.encode_s(self.tier, batch, meter.compute) * len(batch) * stretch, now)
        for f in batch:
            f.record.encode_end = now
            if ws is not None and ws.should_keep(now):
                ws.started(str(f.record.request.request_id), now)
                f.record.stolen = True
                f.record.prefill_node = f.record.decode_node = self.name
                self.stolen.model.add(f)
            elif self.router.route_by_load([self.local.model.load] if has_local else [], self.cluster.remote_loads(),
                                           self.cluster.saturation_load) == "local":
                f.record.local = True
                f.record.prefill_node = self.name
                self.local.model.add(f)  # same GPU: the embeddings never leave it
            else:
                self.cluster.send_to_prefill(f, self, now)
        if not self.pending:  # the worker's stream ran empty: work-conserving policies release what waits
            self.policy.encoder_idle(now)
            self._poll(now)
        self._kick(now)
        if self.local is not None:
            self._local_step(now)

    # --- local prefill (E+P) and stolen work (E) ----------------------------------------------

    def _local_step(self, now: float) -> None:
        if self.gpu.prefill.busy or not self.local.model.has_work():
            return
        plan, prefill, _ = self.local.next_step(now)
        self._local_step_tokens = plan.prefill_tokens
        self.gpu.start_prefill(prefill, self._local_stepped, plan)

    def _local_stepped(self, plan: StepPlan) -> None:
        now = self.cluster.events.now
        self._local_step_tokens = 0
        self.local.finish_step(plan, now, self.gpu.prefill.held_by_stack)
        self._local_step(now)

    def _stolen_step(self, now: float) -> None:
        plan, prefill, decode = self.stolen.next_step(now)
        seconds = prefill + decode
        self._busy = True
        self.usage.stage_busy_s["stolen"] += seconds
        self.usage.busy_s += seconds
        self._run(now, seconds, self._stolen_stepped, (plan, seconds))

    def _run(self, now: float, seconds: float, done, arg) -> None:
        """E: `seconds` of work on the GPU (its whole, or its share of a shared core), then `done(arg)`."""
        if self.lane is not None:
            self.lane.run(seconds, done, arg)
        else:
            self.cluster.events.at(now + seconds, done, arg)

    def _held_by_stack(self, job: str) -> float:
        """How much longer the stack's jobs beside it made the last `job` (encode, or a stolen step: only on an E
        node, which runs both on its lane)."""
        if job == "encode" and self.gpu is not None:
            return self.gpu.encoder.held_by_stack
        return self.lane.held_by_stack if self.lane is not None else 0.0

    def _stolen_stepped(self, arg: tuple[StepPlan, float]) -> None:
        plan, seconds = arg
        now = self.cluster.events.now
        self._busy = False
        self.stealing.record_step(seconds, now)
        for f in self.stolen.finish_step(plan, now, self._held_by_stack("stolen")).finished:
            self.stealing.finished(str(f.record.request.request_id), now)
        self._kick(now)

    def _stolen_coasted(self, ends: list[float], seconds: list[float]) -> None:
        total = sum(seconds)
        self.usage.stage_busy_s["stolen"] += total
        self.usage.busy_s += total
        for end, dt in zip(ends, seconds):
            self.stealing.record_step(dt, end)
        self._busy = False
        self._kick(self.cluster.events.now)
