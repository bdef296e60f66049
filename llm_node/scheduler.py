"""Which sequences run in the next step, and where each goes after it.

First come, first served: every running sequence decodes one token per step, then waiting
sequences are admitted in arrival order while they fit under `max_num_seqs` and the step's token
budget `max_num_batched_tokens` (a prefill costs its prompt length, a decode one token). The queue
head is never skipped, so a long prompt cannot be starved by short ones behind it.

The engine's role decides what happens after a sequence's prefill:
- "combined": it stays and decodes here;
- "prefill": it leaves with its KV cache for a decode worker (unless its first token finished it);
- "decode": sequences arrive with imported KV and already-produced tokens and need no prefill;
  they only wait for a free slot.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from llm_node.engine_config import EngineConfig
from llm_node.sequence import Sequence, SequenceStatus


@dataclass
class StepPlan:
    """The only thing `execute` needs: which sequences to run and how."""

    prefills: list[Sequence] = field(default_factory=list)
    """Sequences whose prompts run as one batched prefill this step, in arrival order."""
    decodes: list[Sequence] = field(default_factory=list)
    """Sequences that each feed their last token to one batched decode forward this step."""
    admitted: list[Sequence] = field(default_factory=list)
    """Sequences this plan moved from waiting to running (what `unschedule` puts back)."""

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_tokens(self) -> int:
        """Tokens the step's forwards process."""
        return sum(len(s.prefill_ids) for s in self.prefills) + len(self.decodes)


class Scheduler:
    """The waiting queue (FCFS) and the running set of one engine."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan(decodes=list(self.running))
        budget = self.config.max_num_batched_tokens - len(plan.decodes)
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cost = len(seq.prefill_ids) if seq.needs_prefill else 1
            if cost > budget:
                break
            self.waiting.popleft()
            budget -= cost
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.admitted.append(seq)
            (plan.prefills if seq.needs_prefill else plan.decodes).append(seq)
        return plan

    def unschedule(self, plan: StepPlan) -> None:
        """Undo `schedule` for a plan whose step did not run (a preempted prefill): its admitted
        sequences go back to the head of the queue, in order."""
        for seq in reversed(plan.admitted):
            self.running.remove(seq)
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def after_step(self, seq: Sequence, was_prefill: bool, finished: bool) -> bool:
        """Retire `seq` if its step finished it or, on a prefill engine, hands it off; True on hand-off."""
        handoff = not finished and was_prefill and self.config.role == "prefill"
        if finished or handoff:
            seq.status = SequenceStatus.FINISHED
            self.running.remove(seq)
        return handoff

    def abort(self, request_id: str) -> Sequence | None:
        """Remove the request from wherever it is; None if this engine does not hold it."""
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    seq.status = SequenceStatus.FINISHED
                    return seq
        return None

    def get(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.waiting, *self.running) if s.request_id == request_id), None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
