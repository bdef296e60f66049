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

import torch

from coordinator.protocol.logprobs import TokenLogprobs
from llm_node.detokenizer import IncrementalDetokenizer
from llm_node.engine_api import EngineRequest, StepOutput
from llm_node.engine_config import EngineConfig
from llm_node.kv import SequenceKV
from llm_node.model_runner import ModelRunner
from llm_node.preemption import Preempted, PrefillPreemption
from llm_node.sampling import sample, token_logprobs
from llm_node.scheduler import Scheduler, StepPlan
from llm_node.sequence import Sequence

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
        self.runner.decode_batches.max_rows = self.config.max_num_seqs
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
        if request.kv_transfer_params is not None:
            raise ValueError(f"request {request.request_id!r} was prefilled by a vLLM engine (kv_transfer_params); "
                             "the reference engine decodes only KV caches sent over our transport")
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
            if request.output_token_ids:  # a resumed run: prefill the prompt and the tokens already streamed
                seq.output_ids = list(request.output_token_ids)
                seq.positions = self.runner.extend_positions(seq.positions, len(seq.prompt_ids), len(seq.output_ids),
                                                             seq.rope_delta)
                for token in seq.output_ids:
                    seq.detokenizer.push([token])
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
        self.runner.check_token_ids([*r.prompt_token_ids, *r.output_token_ids], f"request {r.request_id!r}")
        total = len(r.prompt_token_ids) + r.sampling.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            raise ValueError(
                f"request {r.request_id!r}: prompt {len(r.prompt_token_ids)} + max_tokens {r.sampling.max_tokens}"
                f" exceeds the model's {self.max_model_len} positions"
            )
        if n_out >= r.sampling.max_tokens:
            raise ValueError(f"request {r.request_id!r}: {n_out} tokens already reach max_tokens")
        if role == "decode":
            if r.kv is None or n_out == 0:
                raise ValueError(f"request {r.request_id!r}: a decode engine needs kv and output_token_ids")
            self.runner.layout.check(r.kv, len(r.prompt_token_ids) + n_out - 1, f"request {r.request_id!r} kv")
            _check_finite(r.kv, f"request {r.request_id!r}: the KV cache")
            return
        if r.kv is not None:
            raise ValueError(f"request {r.request_id!r}: kv is only for a decode engine, not {role}")
        if len(r.prompt_token_ids) + n_out > self.config.max_num_batched_tokens:
            raise ValueError(
                f"request {r.request_id!r}: prompt of {len(r.prompt_token_ids) + n_out} tokens exceeds"
                f" max_num_batched_tokens={self.config.max_num_batched_tokens}"
            )
        self.runner.check_mm(r.prompt_token_ids, r.mm_embeddings, r.media)
        if r.mm_embeddings is not None:
            _check_finite(r.mm_embeddings, f"request {r.request_id!r}: the modality embeddings")

    def step(self) -> list[StepOutput]:
        plan = self.schedule()
        try:
            out = self.execute(plan)
        except Preempted:  # nothing ran to completion: the step is retried as if never scheduled
            self.scheduler.unschedule(plan)
            raise
        except Exception as e:  # one request's fault must not fail the others in its step
            return self._fail_culprits(plan, e)
        outputs = self.update(plan, out)
        if not self.has_unfinished():  # idle: the kept decode batch (a copy of its KV caches) is not held meanwhile
            self.runner.decode_batches.clear()
        return outputs

    def _fail_culprits(self, plan: StepPlan, error: Exception) -> list[StepOutput]:
        """The step failed: run each of its sequences alone (execute changes no sequence state), fail those
        that fail alone, and put the rest back as if the step had not been scheduled. A failure only the
        batch shows fails the step's new prefills (the arrivals that made the batch too much) if its
        decodes run without them, else the whole step; never the engine's other requests."""
        seqs = [*plan.prefills, *plan.decodes]
        self.scheduler.unschedule(plan)
        culprits: dict[str, Exception] = {}
        if len(seqs) > 1:
            for seq in seqs:
                culprits |= self._fails({seq.request_id: seq}, StepPlan(prefills=[seq]) if seq.needs_prefill
                                        else StepPlan(decodes=[seq]))
            if not culprits and plan.prefills and plan.decodes:
                culprits = {s.request_id: error for s in plan.prefills} if not self._fails(
                    {"decodes": plan.decodes[0]}, StepPlan(decodes=plan.decodes)) else {}
        if not culprits:
            culprits = {s.request_id: error for s in seqs}
        outputs = []
        for rid, cause in culprits.items():
            seq = self.scheduler.abort(rid)
            if seq is not None:
                seq.finish_reason = "error"
            outputs.append(StepOutput(request_id=rid, new_token_ids=[], new_text="", finished=True,
                                      finish_reason="error", error=f"the engine failed on this request: "
                                      f"{type(cause).__name__}: {cause}"))
        return outputs

    def _fails(self, label: dict, plan: StepPlan) -> dict[str, Exception]:
        """{label key: the exception} if `plan` fails when executed, else {} (Preempted passes through)."""
        try:
            self.execute(plan)
        except Preempted:
            raise
        except Exception as e:
            return {k: e for k in label}
        return {}

    def schedule(self) -> StepPlan:
        return self.scheduler.schedule()

    def execute(self, plan: StepPlan) -> ExecuteOutput:
        """Run the plan's forwards and sample; changes no sequence state but its random generator."""
        out = ExecuteOutput()
        if plan.prefills:
            start = time.perf_counter()
            with self.preemption.prefill() if self.preemption is not None else nullcontext():
                result = self.runner.prefill(
                    [s.prefill_ids for s in plan.prefills], [s.mm_embeddings for s in plan.prefills],
                    [s.positions for s in plan.prefills], [s.num_prompt_tokens for s in plan.prefills],
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
        prefill_lps = _logprobs(out.prefill_logits, out.prefill_tokens, plan.prefills)
        decode_lps = _logprobs(out.decode_logits, out.decode_tokens, plan.decodes)
        for i, seq in enumerate(plan.prefills):
            seq.kv, seq.mm_embeddings, seq.positions = out.prefill_kvs[i], None, None
            seq.prefill_s += step_s
            output = self._advance(seq, out.prefill_tokens[i], out.prefill_logits[i], prefill_lps[i], was_prefill=True)
            output.prefill_s = step_s
            outputs.append(output)
        for i, seq in enumerate(plan.decodes):
            seq.kv.append(out.decode_new_kv[:, :, i])
            seq.decode_s += step_s
            output = self._advance(seq, out.decode_tokens[i], out.decode_logits[i], decode_lps[i], was_prefill=False)
            output.decode_s = step_s
            outputs.append(output)
        return outputs

    def _advance(self, seq: Sequence, token: int, logits: torch.Tensor, logprobs: TokenLogprobs | None,
                 was_prefill: bool) -> StepOutput:
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
            logprobs=[logprobs] if logprobs is not None else [],
            finished=reason is not None,
            finish_reason=reason,
            handoff_kv=seq.kv.export() if handoff else None,
            handoff_output_ids=list(seq.output_ids) if handoff else [],
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


def _logprobs(logits: torch.Tensor | None, tokens: list[int], seqs: list[Sequence]) -> list[TokenLogprobs | None]:
    """Per sequence of one forward, its token's log-probabilities if its request asked for them."""
    if logits is None:
        return [None] * len(seqs)
    return token_logprobs(logits, tokens, [s.sampling for s in seqs])


def _check_finite(t: torch.Tensor, what: str) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what} hold NaN or infinite values; the sender produced a broken tensor")
