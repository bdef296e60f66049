"""Settings of one LLM worker (CLI flags -> this model)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from coordinator.protocol.roles import LLMRole
from coordinator.protocol.worker_config import WorkerConfig
from llm_node.engine_config import EngineConfig

EngineKind = Literal["reference", "vllm", "null"]
ENGINE_KINDS: tuple[EngineKind, ...] = get_args(EngineKind)


class LLMWorkerConfig(WorkerConfig):
    engine: EngineKind = "reference"
    """reference: tierserve's PyTorch engine (exact, the oracle); vllm: vLLM's engine (llm_node/vllm_engine.py);
    null: no model, instant tokens, for measuring the serving path (llm_node/null_engine.py; combined role only)."""
    kv_cache_mib: int = Field(256, ge=16)
    """vLLM engine: memory for its KV cache (vLLM otherwise sizes it from the machine's memory)."""
    role: LLMRole = "combined"
    """combined = prefill + decode here; prefill hands the KV cache to a decode worker."""
    max_num_seqs: int = Field(32, ge=1)
    """Most sequences in one engine step."""
    max_num_batched_tokens: int | None = Field(None, ge=16)
    """Most tokens in one step; None: max(4096, the model's context length). There is no chunked
    prefill, so it must be at least the context length, or long prompts could never run."""
    colocated_with: str | None = None
    """The encode worker whose GPU this worker shares (its "local" prefill worker, share s of prefills)."""
    max_held: int | None = Field(None, ge=1)
    """Most requests taken from the job stream at once (queued for the engine or running); more wait in
    the stream, where they count in this worker's reported load. None: twice max_num_seqs."""
    recv_timeout_s: float = Field(30.0, gt=0)
    """How long to wait for a job's tensors after its control message arrived."""
    drain_timeout_s: float = Field(0.0, ge=0)
    """On SIGTERM, seconds to keep serving what this worker holds while routing sends nothing new (a rolling
    restart); what is left then is re-run elsewhere by the coordinator. 0: stop at once."""

    def engine_config(self, context_length: int) -> EngineConfig:
        """The engine's settings for a model of `context_length` positions; SystemExit when they cannot serve it."""
        budget = self.max_num_batched_tokens or max(4096, context_length)
        if budget < context_length:
            raise SystemExit(f"--max-num-batched-tokens {budget} is below the model's context length {context_length}: "
                             f"prompts the API accepts could never be prefilled; raise it to at least {context_length}")
        return EngineConfig(role=self.role, max_num_seqs=self.max_num_seqs, max_num_batched_tokens=budget)
