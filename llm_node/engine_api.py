"""What the LLM worker needs of an engine: requests in, per-step outputs out, aborts; one shape for all.

    engine.add(request)          # queue; raises ValueError (keeping nothing) when it cannot run here
    outputs = engine.step()      # one scheduling step; a StepOutput per request that progressed
    engine.abort(request_id)     # drop it; its final output (reason "abort"), or None
    engine.has_unfinished()

`step()` runs in a worker thread while the event loop keeps transfers and heartbeats going; `add` and
`abort` are only called between steps, so an engine needs no locks. Engines: `ReferenceEngine`
(llm_node/engine.py, the exactness oracle) and `VllmEngine` (llm_node/vllm_engine.py), chosen by name
through llm_node/engines.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from coordinator.protocol.logprobs import TokenLogprobs
from coordinator.protocol.messages import EncodedMedia, SamplingParams
from llm_node.engine_config import EngineConfig


class Engine(Protocol):
    """The engine contract of DESIGN.md; the worker holds one and knows nothing else of it."""

    config: EngineConfig

    def add(self, request: EngineRequest) -> None: ...

    def step(self) -> list[StepOutput]: ...

    def abort(self, request_id: str) -> StepOutput | None: ...

    def has_unfinished(self) -> bool: ...


@dataclass
class EngineRequest:
    """A request entering an engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    mm_embeddings: torch.Tensor | None = None
    """[n_placeholder_tokens, hidden], filling the prompt's placeholder positions in order (prefill, combined)."""
    media: list[EncodedMedia] = field(default_factory=list)
    """Per media item: its rows of mm_embeddings and its grid (M-RoPE positions); prefill, combined."""
    rope_delta: int = 0
    """Decode role only: the M-RoPE delta the prefill worker computed (DecodeJob.rope_delta)."""
    kv: torch.Tensor | None = None
    """Decode role only: the exported cache [layers, 2, kv_heads, L, head_dim], L = prompt + outputs - 1."""
    kv_transfer_params: dict | None = None
    """Decode role on vLLM: where its KV connector pulls the prefill's cache from (DecodeJob.kv_transfer_params)."""
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens already produced and streamed: by the prefill worker (decode role, with `kv`), or by an
    earlier run of the request on a worker that died (prefill and combined roles, without `kv`: the
    prompt and these tokens are prefilled together and generation continues after them)."""


@dataclass
class StepOutput:
    """What one step did for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    """Detokenized text delta (never a split character; a matched stop string is not included)."""
    logits: list[torch.Tensor] = field(default_factory=list)
    """float32 [vocab] per new token, only with sampling.return_logits."""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    """One per new token, only with sampling.logprobs set: the token's log-probability under the model's raw
    distribution (log_softmax of the logits it was sampled from, float32, before temperature and top_p) and
    the sampling.logprobs most likely tokens with theirs. Every engine reports these same numbers."""
    finished: bool = False
    """The request is complete; False on a hand-off, which continues on a decode worker."""
    finish_reason: Literal["stop", "length", "abort", "error"] | None = None
    error: str | None = None
    """With finish_reason "error": why this request's own computation failed (the step's others go on)."""
    handoff_kv: torch.Tensor | None = None
    """Prefill role: the request continues elsewhere; its KV cache [layers, 2, kv_heads, L, head_dim]."""
    handoff_output_ids: list[int] = field(default_factory=list)
    """Prefill role: every output token so far (more than one when a re-run resumed), for the decode worker."""
    handoff_rope_delta: int = 0
    handoff_params: dict | None = None
    """Prefill role on vLLM: the request continues elsewhere; its KV connector's kv_transfer_params (JSON),
    which the decode engine pulls the cache with (no tensors on our transport)."""
    """Prefill role: the rope delta that travels with handoff_kv (positions of generated tokens)."""
    prefill_s: float = 0.0
    """Wall seconds of this step if it produced the request's first token (the whole batched step,
    which the request waited for); sum over outputs for the total (Sequence.prefill_s keeps it)."""
    decode_s: float = 0.0
    """Wall seconds of this step if the request decoded in it, likewise."""
