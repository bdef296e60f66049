"""The settings every engine takes (the worker builds them from its flags)."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.protocol.roles import LLM_ROLES, LLMRole


@dataclass(frozen=True)
class EngineConfig:
    role: LLMRole = "combined"
    """combined: prefill and decode here; prefill: hand each request off after its first token;
    decode: take requests with imported KV and decode them."""
    max_num_seqs: int = 16
    """Most sequences running at once (prefilling or decoding)."""
    max_num_batched_tokens: int = 4096
    """Most tokens one step's forwards process (prompt tokens of its prefills + one per decode);
    also the longest prompt accepted, as there is no chunked prefill."""

    def __post_init__(self) -> None:
        if self.role not in LLM_ROLES:
            raise ValueError(f"role={self.role!r}: must be one of {LLM_ROLES}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs}: must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= max_num_seqs={self.max_num_seqs}"
            )
