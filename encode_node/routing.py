"""Where each encoded request goes: kept for the stealing worker on this GPU, the co-located prefill
worker (share s), or a remote prefill/combined worker. The policies decide; this only feeds them.

Workers on this encode GPU announce themselves with `colocated_with` = this worker's id: role
"prefill" is the space-sharing local prefill worker of the offload share s; role "combined" is the
time-sharing stealing worker (coordinator/protocol/colocation.py). Another encoder's co-located
workers are never targets here: they belong to that encoder's GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.policies.base import PolicyConfig
from coordinator.policies.offload import OffloadRouter
from coordinator.policies.work_stealing import WorkStealing
from coordinator.protocol.messages import EncodeJob
from coordinator.protocol.registry import WorkerStatus, least_loaded


@dataclass
class Targets:
    """The live prefill-capable workers, sorted by where they run relative to this encoder."""

    local: list[WorkerStatus] = field(default_factory=list)
    remote: list[WorkerStatus] = field(default_factory=list)
    steal: list[WorkerStatus] = field(default_factory=list)
    every: list[WorkerStatus] = field(default_factory=list)

    @classmethod
    def sort(cls, alive: list[WorkerStatus], encoder_id: str) -> "Targets":
        t = cls(every=alive)
        for w in alive:
            if w.info.colocated_with is None:
                t.remote.append(w)
            elif w.info.colocated_with == encoder_id:
                (t.local if w.info.role == "prefill" else t.steal).append(w)
        return t


class RequestRouter:
    """Feeds the offload and stealing policies with what the worker observes, and asks them per request."""

    def __init__(self, encoder_id: str) -> None:
        self.encoder_id = encoder_id
        self.offload = OffloadRouter(0.0)
        self.saturation_load: int | None = None
        """OffloadConfig.saturation_load: when a side counts as saturated."""
        self.stealing = WorkStealing()
        self._rr = 0

    def configure(self, policy: PolicyConfig) -> bool:
        """Apply run-time knobs; True if anything changed. A new stealing config keeps the counters."""
        changed = False
        if policy.offload.s != self.offload.share:
            self.offload.set_share(policy.offload.s)
            changed = True
        if policy.offload.saturation_load != self.saturation_load:
            self.saturation_load = policy.offload.saturation_load
            changed = True
        if policy.stealing != self.stealing.config:
            self.stealing.config = policy.stealing
            changed = True
        return changed

    def observe(self, targets: Targets, pending_batches: int, stolen_held: int, now: float) -> None:
        """Once per encoded micro-batch, before routing its requests."""
        self.stealing.observe_encode_queue(pending_batches, now)
        self.stealing.observe_remote_load(min((w.load for w in targets.remote), default=None), now)
        self.stealing.observe_local_load(stolen_held, now)

    def choose(self, job: EncodeJob, targets: Targets, now: float) -> WorkerStatus | None:
        """The worker that prefills `job`; None if no worker can."""
        self._rr += 1
        if job.prefill_worker is not None:  # pinned by the caller (tests, benchmarks)
            return least_loaded([t for t in targets.every if t.info.worker_id == job.prefill_worker], self._rr)
        if targets.steal and self.stealing.should_keep(now):
            self.stealing.started(job.request_id, now)
            return least_loaded(targets.steal, self._rr)
        side = self.offload.route_by_load([w.load for w in targets.local], [w.load for w in targets.remote],
                                          self.saturation_load)
        if side is None:  # stealing (asked above) already covers "no remote worker alive"
            return None
        return least_loaded(targets.local if side == "local" else targets.remote, self._rr)

    def stats(self) -> dict[str, float]:
        realised = self.offload.realised_share
        s = self.stealing
        return ({"offload_share": self.offload.share, "stealing_enabled": float(s.config.enabled),
                 "stolen_total": float(s.stolen_total), "stolen_in_flight": float(s.stolen_in_flight)}
                | ({} if realised is None else {"offload_realised": realised}))
