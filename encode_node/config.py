"""Settings of one encode worker (CLI flags -> this model)."""

from __future__ import annotations

from pydantic import Field

from coordinator.protocol.worker_config import WorkerConfig


class EncodeWorkerConfig(WorkerConfig):
    max_batch_size: int = Field(8, ge=1)
    """Most requests one encoder forward pass takes (whatever is queued, up to this)."""
    device: str = "cpu"
