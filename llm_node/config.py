"""Settings of one LLM worker (CLI flags -> this model)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coordinator.protocol.models import DEFAULT_MODEL_DIR


class LLMWorkerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, protected_namespaces=())

    worker_id: str
    role: Literal["combined", "prefill", "decode"] = "combined"
    """combined = prefill + decode here; prefill hands the KV cache to a decode worker."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "tierserve"
    model_dir: Path = DEFAULT_MODEL_DIR
    model_name: str = "tiny-llava"
    threads: int = Field(1, ge=1)
    """torch intra-op threads; set explicitly so co-located processes don't oversubscribe cores."""
    max_num_seqs: int = Field(32, ge=1)
    """Most sequences in one engine step."""
    max_num_batched_tokens: int | None = Field(None, ge=16)
    """Most tokens in one step; None: max(4096, the model's context length). There is no chunked
    prefill, so it must be at least the context length, or long prompts could never run."""
    transport: str = "local"
    tier: str = "cpu"
    heartbeat_ttl_s: float = Field(10.0, gt=0)
    recv_timeout_s: float = Field(30.0, gt=0)
    """How long to wait for a job's tensors after its control message arrived."""
