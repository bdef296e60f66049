"""Settings of one encode worker (CLI flags -> this model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coordinator.protocol.models import DEFAULT_MODEL_DIR


class EncodeWorkerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, protected_namespaces=())

    worker_id: str
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "tierserve"
    """Namespace of every Redis key; clusters or test runs sharing one Redis use different prefixes."""
    model_dir: Path = DEFAULT_MODEL_DIR
    """A local transformers checkpoint (config, processor, safetensors)."""
    model_name: str = "tiny-llava"
    max_batch_size: int = Field(8, ge=1)
    """Most requests one encoder forward pass takes (whatever is queued, up to this)."""
    threads: int = Field(1, ge=1)
    """torch intra-op threads; set explicitly so co-located processes don't oversubscribe cores."""
    transport: str = "local"
    tier: str = "cpu"
    device: str = "cpu"
    heartbeat_ttl_s: float = Field(10.0, gt=0)
