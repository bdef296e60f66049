"""The reference PyTorch engine of an LLM node: continuous batching over a Hugging Face model.

    plan = self.schedule()      # which sequences prefill and which decode (llm_node/scheduler.py)
    out = self.execute(plan)    # batched forwards and sampling; changes no sequence state
    return self.update(plan, out)  # append tokens, detokenize, finish, hand off

Roles are modes of this one engine (see llm_node/scheduler.py). It is exact: the tokens and
logits it produces match `model.generate()` on the same inputs (tests/llm_node/).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from coordinator.protocol.messages import EncodedMedia, SamplingParams
from llm_node.detokenizer import IncrementalDetokenizer
from llm_node.kv import SequenceKV
from llm_node.model_runner import ModelRunner
from llm_node.preemption import Preempted, PrefillPreemption
from llm_node.sampling import sample
from llm_node.scheduler import Scheduler, StepPlan
from llm_node.sequence import Sequence

EngineRole = Literal["combined", "prefill", "decode"]


@dataclass(frozen=True)
class EngineConfig:
    role: EngineRole = "combined"
    """combined: prefill and decode here; prefill: hand each request off after its first token;
    decode: take requests with imported KV and decode them."""
    max_num_seqs: int = 16
    """Most sequences running at once (prefilling or decoding)."""
    max_num_batched_tokens: int = 4096
    """Most tokens one step's forwards process (prompt tokens of its prefills + one per decode);
    also the longest prompt accepted, as there is no chunked prefill."""

    def __post_init__(self) -> None:
        if self.role not in get_args(EngineRole):
            raise ValueError(f"role={self.role!r}: must be one of {get_args(EngineRole)}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs}: must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= max_num_seqs={self.max_num_seqs}"
            )


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
    output_token_ids: list[int] = field(default_factory=list)
    """Decode role only: tokens already produced (and streamed) by the prefill worker."""


@dataclass
class StepOutput:
    """What one step did for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    """Detokenized text delta (never a split character; a matched stop string is not included)."""
    logits: list[torch.Tensor] = field(default_factory=list)
    """float32 [vocab] per new token, only with sampling.return_logits."""
    finished: bool = False
    """The request is complete; False on a hand-off, which continues on a decode worker."""
    finish_reason: Literal["stop", "length", "abort"] | None = None
    handoff_kv: torch.Tensor | None = None
    """Prefill role: the request continues elsewhere; its KV cache [layers, 2, kv_heads, L, head_dim]."""
    handoff_rope_delta: int = 0
    """Prefill role: the rope delta that travels with handoff_kv (positions of generated tokens)."""
    prefill_s: float = 0.0
    """Wall seconds of this step if it produced the request's first token (the whole batched step,
    which the request waited for); sum over outputs for the total (Sequence.prefill_s keeps it)."""
    decode_s: float = 0.0
    """Wall seconds of this step if the request decoded in it, likewise."""


@dataclass
class ExecuteOutput:
    """The results of one step's forwards, aligned with the plan's lists."""

    prefill_tokens: list[int] = field(default_factory=list)
    """Sampled first token of each plan.prefills sequence."""
    prefill_logits: torch.Tensor | None = None
    """[len(prefills), vocab] float32."""
    prefill_kvs: list[SequenceKV] = field(default_factory=list)
    """Each prefilled sequence's new cache."""
    prefill_s: float = 0.0
    """Wall seconds of the batched prefill (forward + sampling)."""
    decode_tokens: list[int] = field(default_factory=list)
    """Sampled next token of each plan.decodes sequence."""
    decode_logits: torch.Tensor | None = None
    """[len(decodes), vocab] float32."""
    decode_new_kv: torch.Tensor | None = None
    """[layers, 2, len(decodes), kv_heads, 1, head_dim]: the fed tokens' cache entries."""
    decode_s: float = 0.0
    """Wall seconds of the batched decode step (forward + sampling)."""


class ReferenceEngine:
    """Continuous batching over one model; `tokenizer` may also be a processor that has one."""

    def __init__(self, model, tokenizer, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.runner = ModelRunner(model)
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self.scheduler = Scheduler(self.config)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = self.tokenizer.eos_token_id if eos is None else eos
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or ()))
        text_config = model.config.get_text_config(decoder=True)
        self.max_model_len: int | None = getattr(text_config, "max_position_embeddings", None)
        self.preemption: PrefillPreemption | None = None
        """Set on a stealing worker: its prefills give way to the encoder (llm_node/preemption.py)."""

    def add(self, request: EngineRequest) -> None:
        """Queue a request; raises ValueError (and keeps nothing) when it cannot run on this engine."""
        self._check(request)
        seq = Sequence(
            request_id=request.request_id,
            prompt_ids=list(request.prompt_token_ids),
            sampling=request.sampling,
            detokenizer=IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, request.sampling.stop),
            mm_embeddings=request.mm_embeddings,
        )
        if request.kv is None:
            seq.positions, seq.rope_delta = self.runner.prompt_positions(seq.prompt_ids, request.media)
        else:
            seq.rope_delta = request.rope_delta
            seq.mm_embeddings = None
            seq.kv = SequenceKV(request.kv.to(self.runner.device))
            seq.output_ids = list(request.output_token_ids)
            # Replaying the streamed tokens puts the detokenizer where the prefill worker left it.
            for token in seq.output_ids:
                seq.detokenizer.push([token])
        self.scheduler.add(seq)

    def _check(self, r: EngineRequest) -> None:
        role, n_out = self.config.role, len(r.output_token_ids)
        if self.scheduler.get(r.request_id) is not None:
            raise ValueError(f"request {r.request_id!r} is already in this engine")
        if not r.prompt_token_ids:
            raise ValueError(f"request {r.request_id!r}: empty prompt")
        total = len(r.prompt_token_ids) + r.sampling.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            raise ValueError(
                f"request {r.request_id!r}: prompt {len(r.prompt_token_ids)} + max_tokens {r.sampling.max_tokens}"
                f" exceeds the model's {self.max_model_len} positions"
            )
        if role == "decode":
            if r.kv is None or n_out == 0:
                raise ValueError(f"request {r.request_id!r}: a decode engine needs kv and output_token_ids")
            if n_out >= r.sampling.max_tokens:
                raise ValueError(f"request {r.request_id!r}: {n_out} tokens already reach max_tokens")
            self.runner.layout.check(r.kv, len(r.prompt_token_ids) + n_out - 1, f"request {r.request_id!r} kv")
            return
        if r.kv is not None or n_out:
            raise ValueError(f"request {r.request_id!r}: kv/output_token_ids are only for a decode engine, not {role}")
        if len(r.prompt_token_ids) > self.config.max_num_batched_tokens:
            raise ValueError(
                f"request {r.request_id!r}: prompt of {len(r.prompt_token_ids)} tokens exceeds"
                f" max_num_batched_tokens={self.config.max_num_batched_tokens}"
            )
        self.runner.check_mm(r.prompt_token_ids, r.mm_embeddings, r.media)

    def step(self) -> list[StepOutput]:
        plan = self.schedule()
        try:
            out = self.execute(plan)
        except Preempted:  # nothing ran to completion: the step is retried as if never scheduled
            self.scheduler.unschedule(plan)
            raise
        return self.update(plan, out)

    def schedule(self) -> StepPlan:
        return self.scheduler.schedule()

    def execute(self, plan: StepPlan) -> ExecuteOutput:
        """Run the plan's forwards and sample; changes no sequence state but its random generator."""
        out = ExecuteOutput()
        if plan.prefills:
            start = time.perf_counter()
            with self.preemption.prefill() if self.preemption is not None else nullcontext():
                result = self.runner.prefill(
                    [s.prompt_ids for s in plan.prefills], [s.mm_embeddings for s in plan.prefills],
                    [s.positions for s in plan.prefills],
                )
            out.prefill_tokens = self._sample(result.logits, plan.prefills)
            out.prefill_logits, out.prefill_kvs = result.logits, result.kvs
            out.prefill_s = time.perf_counter() - start
        if plan.decodes:
            for s in plan.decodes:
                if s.kv.length != s.num_prompt_tokens + len(s.output_ids) - 1:
                    raise RuntimeError(f"{s.request_id}: kv length {s.kv.length} out of step with its tokens")
            start = time.perf_counter()
            result = self.runner.decode([s.output_ids[-1] for s in plan.decodes], [s.kv for s in plan.decodes],
                                        [s.rope_delta for s in plan.decodes])
            out.decode_tokens = self._sample(result.logits, plan.decodes)
            out.decode_logits, out.decode_new_kv = result.logits, result.new_kv
            out.decode_s = time.perf_counter() - start
        return out

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        return sample(logits, [s.sampling for s in seqs], [s.next_generator() for s in seqs])

    def update(self, plan: StepPlan, out: ExecuteOutput) -> list[StepOutput]:
        """Apply the step's results to its sequences; returns one output per sequence in the plan."""
        outputs = []
        # Every sequence in the step waits for the whole step (its prefills and its decodes), so each
        # is charged the step's full wall time: the latency view, which overhead = e2e - compute needs.
        step_s = out.prefill_s + out.decode_s
        for i, seq in enumerate(plan.prefills):
            seq.kv, seq.mm_embeddings, seq.positions = out.prefill_kvs[i], None, None
            seq.prefill_s += step_s
            output = self._advance(seq, out.prefill_tokens[i], out.prefill_logits[i], was_prefill=True)
            output.prefill_s = step_s
            outputs.append(output)
        for i, seq in enumerate(plan.decodes):
            seq.kv.append(out.decode_new_kv[:, :, i])
            seq.decode_s += step_s
            output = self._advance(seq, out.decode_tokens[i], out.decode_logits[i], was_prefill=False)
            output.decode_s = step_s
            outputs.append(output)
        return outputs

    def _advance(self, seq: Sequence, token: int, logits: torch.Tensor, was_prefill: bool) -> StepOutput:
        """Append the token, detokenize, decide whether the sequence finishes or leaves."""
        seq.output_ids.append(token)
        step_logits = []
        if seq.sampling.return_logits:
            step_logits = [logits.detach().to("cpu", torch.float32).clone()]
            seq.step_logits.extend(step_logits)
        delta = seq.detokenizer.push([token])
        reason = seq.stop_reason(token, self.eos_ids, delta.stopped)
        text = delta.text if reason is None or delta.stopped else delta.text + seq.detokenizer.flush()
        seq.finish_reason = reason
        handoff = self.scheduler.after_step(seq, was_prefill, finished=reason is not None)
        return StepOutput(
            request_id=seq.request_id,
            new_token_ids=[token],
            new_text=text,
            logits=step_logits,
            finished=reason is not None,
            finish_reason=reason,
            handoff_kv=seq.kv.export() if handoff else None,
            handoff_rope_delta=seq.rope_delta if handoff else 0,
        )

    def abort(self, request_id: str) -> StepOutput | None:
        """Drop the request; returns its final output (reason "abort"), or None if this engine does not hold it."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return None
        seq.finish_reason = "abort"
        return StepOutput(request_id=request_id, new_token_ids=[], new_text="", finished=True, finish_reason="abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()
