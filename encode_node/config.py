"""Settings of one encode worker (CLI flags -> this model)."""

from __future__ import annotations

from pydantic import Field

from coordinator.protocol.worker_config import WorkerConfig


class EncodeWorkerConfig(WorkerConfig):
    max_batch_size: int = Field(8, ge=1)
    """Most requests one encoder forward pass takes (whatever is queued, up to this)."""
    drain_timeout_s: float = Field(0.0, ge=0)
    """On SIGTERM, seconds to finish the micro-batches released to this worker while the dispatcher sends
    nothing new (a plan switch or rolling restart); 0 stops at once (the coordinator re-runs what it held)."""
