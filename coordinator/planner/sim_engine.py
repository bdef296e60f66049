"""Continuous batching of one simulated LLM engine, step by step, as llm_node/scheduler.py does it.

Each step: every running sequence decodes one token, then waiting sequences are admitted first come,
first served while they fit under `max_num_seqs` and the token budget (a prefill costs its prompt, a
decode-only arrival one token); the queue head is never skipped. The step runs the prefills' forward
and the decodes' forward back to back, like the reference engine's `execute`. After a prefill: a
"prefill" engine hands the sequence off, a "combined" one keeps decoding it; a "decode" engine only
takes sequences that already have their first token.

Cost per step does not grow with the batch: the engine counts steps, and a sequence that starts
decoding at step f with p tokens already produced finishes at step f + out - p - 1, with context
prompt + p + (k - f) at step k. So the decodes' total context is S + n*k (S summed once per sequence)
and finishers are looked up by step number. Per-step granularity (hence exact TPOT) is kept.

Padded batches (`padded=True`, EngineLimits.pad_to_longest): llm_node's reference engine pads every
batched forward to its longest sequence (model_runner.prefill right-pads the prompts; kv.py's
build_decode_batch left-pads the KV caches and attends over all of it), so a step costs what a uniform
batch at the longest length costs: n prefills of longest prompt P cost a prefill of n*P tokens, and d
decodes whose longest context is L cost a decode step at d*L context tokens (exactly the uniform
batches a profile measures). The longest context is kept like the sum: as the largest `base` among
the decoding sequences (a heap, pruned lazily as they finish) plus k, so a step stays O(1) amortised.
StepPlan's prefill_cost_tokens / decode_cost_context carry the sizes to time the step at; without
padding they are the sums.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from coordinator.planner.goodput import RequestRecord
from coordinator.protocol.roles import LLMRole



@dataclass(slots=True)
class Flight:
    """A request moving through the simulated cluster; the record collects its times."""

    record: RequestRecord
    prompt: int
    """Tokens the prefill processes (text + embeddings); also its KV length after prefill."""
    produced: int = 0
    """Tokens generated so far when it entered the current engine."""
    base: int = 0
    """prompt + produced - (step it started decoding at): its context at step k is base + k."""


@dataclass(slots=True)
class StepPlan:
    """What one step runs."""

    index: int
    """The engine's step number."""
    prefills: list[Flight] = field(default_factory=list)
    """Sequences prefilled in this step, in admission order."""
    prefill_tokens: int = 0
    """Sum of their prompts: the prefill forward's size."""
    decodes: int = 0
    """Sequences that each produce one token in this step's decode forward."""
    context_tokens: int = 0
    """KV tokens those sequences hold in total."""
    prefill_cost_tokens: int = 0
    """Size to time the prefill forward at: prefill_tokens, or len(prefills) x the longest prompt
    when the engine pads its batches."""
    decode_cost_context: int = 0
    """Context to time the decode forward at: context_tokens, or decodes x the longest context when
    the engine pads its batches."""
    admitted: int = 0
    """Sequences this step admitted: its prefills, or on a decode engine the handed-off sequences that join
    the batch (ServiceTimes.admit_s each)."""
    joined: list[Flight] = field(default_factory=list)
    """On a decode engine: the handed-off sequences this step admitted, which decode from this step on."""


@dataclass(slots=True)
class StepResult:
    """Where the step's sequences go next."""

    first_tokens: list[Flight] = field(default_factory=list)
    """Produced their first token in this step (all of plan.prefills)."""
    handoffs: list[Flight] = field(default_factory=list)
    """Prefilled on a "prefill" engine and not finished: their KV goes to a decode engine."""
    finished: list[Flight] = field(default_factory=list)
    """Produced their last token in this step."""
    decoding: list[Flight] = field(default_factory=list)
    """Prefilled in this step on a "combined" engine and not finished: they decode from the next step on."""


class EngineModel:
    """Waiting queue and running set of one engine; no clock (the caller times each StepPlan)."""

    def __init__(self, role: LLMRole, max_num_seqs: int, max_num_batched_tokens: int,
                 padded: bool = False) -> None:
        self.role = role
        self.padded = padded
        """Time each forward at its batch padded to the longest sequence (module docstring)."""
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Flight] = deque()
        self.waiting_tokens = 0
        """Prompt tokens waiting for a prefill (the SM partition's prefill backlog)."""
        self.running = 0
        """Sequences admitted and not yet finished or handed off."""
        self._decoding = 0
        self._context_base = 0
        self._finishing: dict[int, list[Flight]] = {}
        self._step = 0
        self._bases: list[int] = []
        """Padded only: -base of every decoding sequence (a max-heap), with finished ones pruned lazily."""
        self._gone: dict[int, int] = {}
        """Padded only: bases of finished sequences still in _bases, with their counts."""

    @property
    def load(self) -> int:
        """Requests held (waiting or running): what least-loaded routing compares."""
        return len(self.waiting) + self.running

    def has_work(self) -> bool:
        return bool(self.waiting) or self.running > 0

    def add(self, flight: Flight) -> None:
        if self.role == "decode":
            if flight.produced < 1:
                raise ValueError(f"request {flight.record.request.request_id}: a decode engine needs a prefilled "
                                 f"sequence, got produced={flight.produced}")
        elif flight.produced != 0:
            raise ValueError(f"request {flight.record.request.request_id}: a {self.role} engine prefills, "
                             f"got a sequence with produced={flight.produced}")
        if flight.prompt > self.max_num_batched_tokens:
            raise ValueError(f"request {flight.record.request.request_id}: prompt of {flight.prompt} tokens exceeds "
                             f"max_num_batched_tokens={self.max_num_batched_tokens} (no chunked prefill)")
        self.waiting.append(flight)
        if self.role != "decode":
            self.waiting_tokens += flight.prompt

    def schedule(self) -> StepPlan:
        """The next step; call `complete` with it once it has run."""
        k = self._step
        plan = StepPlan(k)
        budget = self.max_num_batched_tokens - self._decoding
        decode_role = self.role == "decode"
        longest = 0
        while self.waiting and self.running < self.max_num_seqs:
            f = self.waiting[0]
            cost = 1 if decode_role else f.prompt
            if cost > budget:
                break
            self.waiting.popleft()
            budget -= cost
            self.running += 1
            plan.admitted += 1
            if decode_role:
                self._start_decoding(f, k)
                plan.joined.append(f)
            else:
                self.waiting_tokens -= f.prompt
                plan.prefills.append(f)
                plan.prefill_tokens += f.prompt
                longest = max(longest, f.prompt)
        plan.decodes = self._decoding
        plan.context_tokens = self._context_base + self._decoding * k
        if self.padded:
            plan.prefill_cost_tokens = len(plan.prefills) * longest
            plan.decode_cost_context = self._decoding * (self._longest_base() + k) if self._decoding else 0
        else:
            plan.prefill_cost_tokens, plan.decode_cost_context = plan.prefill_tokens, plan.context_tokens
        return plan

    def complete(self, plan: StepPlan) -> StepResult:
        """Apply a finished step: who got a first token, who leaves, who is done."""
        k = plan.index
        out = StepResult()
        for f in self._finishing.pop(k, ()):
            self.running -= 1
            self._decoding -= 1
            self._context_base -= f.base
            if self.padded:
                self._gone[f.base] = self._gone.get(f.base, 0) + 1
            out.finished.append(f)
        if self.padded and not self._decoding and self._bases:
            self._bases.clear()  # every entry is stale: drop them at once
            self._gone.clear()
        for f in plan.prefills:
            f.produced = 1
            out.first_tokens.append(f)
            if f.record.request.output_tokens == 1:
                self.running -= 1
                out.finished.append(f)
            elif self.role == "prefill":
                self.running -= 1
                out.handoffs.append(f)
            else:
                self._start_decoding(f, k + 1)
                out.decoding.append(f)
        self._step = k + 1
        return out

    def can_admit(self) -> bool:
        """Would the next step admit the head of the waiting queue?"""
        if not self.waiting or self.running >= self.max_num_seqs:
            return False
        cost = 1 if self.role == "decode" else self.waiting[0].prompt
        return cost <= self.max_num_batched_tokens - self._decoding

    def plain_decode_step(self) -> tuple[int, int] | None:
        """Take the next step now if it would only decode, admitting and finishing no one (so nothing
        outside the engine can tell it happened): its (batch, context to time it at, as
        StepPlan.decode_cost_context). None otherwise."""
        k = self._step
        if not self._decoding or k in self._finishing or self.can_admit():
            return None
        self._step = k + 1
        if self.padded:
            return self._decoding, self._decoding * (self._longest_base() + k)
        return self._decoding, self._context_base + self._decoding * k

    def _longest_base(self) -> int:
        """The largest base among the decoding sequences (padded engines; at least one is decoding)."""
        heap, gone = self._bases, self._gone
        while True:
            top = -heap[0]
            left = gone.get(top)
            if not left:
                return top
            heapq.heappop(heap)
            if left == 1:
                del gone[top]
            else:
                gone[top] = left - 1

    @property
    def step_index(self) -> int:
        """Steps taken so far (the next step's number)."""
        return self._step

    def rewind(self, step: int) -> None:
        """Forget plain decode steps taken from `step` on (they changed nothing else; see plain_decode_step)."""
        if step > self._step:
            raise ValueError(f"cannot rewind forward: step={step} > current step {self._step}")
        self._step = step

    def _start_decoding(self, f: Flight, first_step: int) -> None:
        f.base = f.prompt + f.produced - first_step
        self._context_base += f.base
        self._decoding += 1
        if self.padded:
            heapq.heappush(self._bases, -f.base)
        last = first_step + f.record.request.output_tokens - f.produced - 1
        self._finishing.setdefault(last, []).append(f)
