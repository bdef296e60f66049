"""Settings of one LLM worker (CLI flags -> this model)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from coordinator.protocol.worker_config import WorkerConfig


class LLMWorkerConfig(WorkerConfig):
    role: Literal["combined", "prefill", "decode"] = "combined"
    """combined = prefill + decode here; prefill hands the KV cache to a decode worker."""
    max_num_seqs: int = Field(32, ge=1)
    """Most sequences in one engine step."""
    max_num_batched_tokens: int | None = Field(None, ge=16)
    """Most tokens in one step; None: max(4096, the model's context length). There is no chunked
    prefill, so it must be at least the context length, or long prompts could never run."""
    colocated_with: str | None = None
    """The encode worker whose GPU this worker shares (its "local" prefill worker, share s of prefills)."""
    recv_timeout_s: float = Field(30.0, gt=0)
    """How long to wait for a job's tensors after its control message arrived."""
