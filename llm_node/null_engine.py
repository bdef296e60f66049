"""The null engine: a real LLM worker's engine with no model, for measuring the serving path alone.

`python -m llm_node --engine null` runs the whole worker (job stream, intake, engine loop, token publishing,
aborts, heartbeats) with an engine that computes nothing: each step gives every running request one token
at once. What a benchmark then measures is the coordinator and the Redis hops, never a forward pass
(benchmarks/coordinator_capacity.py). It loads the checkpoint's tokenizer and config, never its weights.

The tokens are a deterministic function of the prompt: the prompt's own ordinary (non-special) tokens,
cycled from an offset the prompt fixes, so the text is real, detokenizable text of the model's tokenizer.
It honours max_tokens and stop strings (and stop_token_ids) through the same detokenizer as the reference
engine, and it never samples EOS, so a request ends by length or by a stop. It has no distribution to
report, so it refuses logprobs and return_logits; it has no KV cache, so it runs only the combined role.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llm_node.detokenizer import IncrementalDetokenizer
from llm_node.engine_api import EngineRequest, StepOutput
from llm_node.engine_config import EngineConfig

FALLBACK_TEXT = " null"
"""Encoded for the tokens of a prompt made only of special tokens (there is nothing of it to echo)."""


@dataclass
class _Running:
    request: EngineRequest
    cycle: list[int]
    """The tokens this request's output cycles through."""
    detokenizer: IncrementalDetokenizer
    output_ids: list[int] = field(default_factory=list)
    prefilled: bool = False
    """It has had its first step (a real engine's prefill)."""


class NullEngine:
    """One token per running request per step, no compute; the Engine protocol of llm_node/engine_api.py."""

    def __init__(self, tokenizer, config: EngineConfig | None = None, max_model_len: int | None = None) -> None:
        self.config = config or EngineConfig()
        if self.config.role != "combined":
            raise ValueError(f"the null engine runs only the combined role, not {self.config.role!r}: it has no KV "
                             "cache to hand from a prefill worker to a decode worker")
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self.max_model_len = max_model_len
        self.vocab_size = len(self.tokenizer)
        self.special_ids = frozenset(self.tokenizer.all_special_ids)
        self.fallback = [t for t in self.tokenizer.encode(FALLBACK_TEXT, add_special_tokens=False)
                         if t not in self.special_ids]
        if not self.fallback:
            raise ValueError(f"the tokenizer has no ordinary token for {FALLBACK_TEXT!r}")
        self.waiting: dict[str, _Running] = {}
        self.running: dict[str, _Running] = {}

    def add(self, request: EngineRequest) -> None:
        """Queue a request; ValueError (keeping nothing) when it cannot run here."""
        rid, sampling = request.request_id, request.sampling
        if rid in self.waiting or rid in self.running:
            raise ValueError(f"request {rid!r} is already in this engine")
        if request.kv is not None or request.kv_transfer_params is not None:
            raise ValueError(f"request {rid!r} carries a KV cache; the null engine runs only the combined role")
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        bad = [t for t in [*request.prompt_token_ids, *request.output_token_ids] if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"request {rid!r}: token ids {bad[:4]} are outside the vocabulary of {self.vocab_size}")
        if sampling.logprobs is not None or sampling.return_logits:
            raise ValueError(f"request {rid!r} asks for logprobs or logits; the null engine has no model "
                             "distribution to report (use the reference or vllm engine)")
        total = len(request.prompt_token_ids) + sampling.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            raise ValueError(f"request {rid!r}: prompt {len(request.prompt_token_ids)} + max_tokens "
                             f"{sampling.max_tokens} exceeds the model's {self.max_model_len} positions")
        if len(request.output_token_ids) >= sampling.max_tokens:
            raise ValueError(f"request {rid!r}: {len(request.output_token_ids)} tokens already reach max_tokens")
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, sampling.stop)
        seq = _Running(request, self._cycle(request.prompt_token_ids), detok, list(request.output_token_ids))
        for token in seq.output_ids:  # a resumed run continues where the detokenizer left off
            detok.push([token])
        self.waiting[rid] = seq

    def _cycle(self, prompt: list[int]) -> list[int]:
        ordinary = [t for t in prompt if t not in self.special_ids] or self.fallback
        start = sum(prompt) % len(ordinary)
        return ordinary[start:] + ordinary[:start]

    def step(self) -> list[StepOutput]:
        """Admit waiting requests up to max_num_seqs, then one token for each running one."""
        start = time.perf_counter()
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            rid = next(iter(self.waiting))
            self.running[rid] = self.waiting.pop(rid)
        stepped = list(self.running.values())
        outputs = [self._advance(seq) for seq in stepped]
        step_s = time.perf_counter() - start
        for seq, out in zip(stepped, outputs):  # the step's wall time, charged as the reference engine does
            if seq.prefilled:
                out.decode_s = step_s
            else:
                out.prefill_s, seq.prefilled = step_s, True
        return outputs

    def _advance(self, seq: _Running) -> StepOutput:
        sampling, rid = seq.request.sampling, seq.request.request_id
        token = seq.cycle[len(seq.output_ids) % len(seq.cycle)]
        seq.output_ids.append(token)
        delta = seq.detokenizer.push([token])
        reason = None
        if delta.stopped or token in sampling.stop_token_ids:
            reason = "stop"
        elif len(seq.output_ids) >= sampling.max_tokens:
            reason = "length"
        text = delta.text if reason is None or delta.stopped else delta.text + seq.detokenizer.flush()
        if reason is not None:
            del self.running[rid]
        return StepOutput(request_id=rid, new_token_ids=[token], new_text=text, finished=reason is not None,
                          finish_reason=reason)

    def abort(self, request_id: str) -> StepOutput | None:
        """Drop the request; its final output (reason "abort"), or None if this engine does not hold it."""
        seq = self.running.pop(request_id, None) or self.waiting.pop(request_id, None)
        if seq is None:
            return None
        return StepOutput(request_id=request_id, new_token_ids=[], new_text="", finished=True, finish_reason="abort")

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)
