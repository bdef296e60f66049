"""The state of one request inside an engine, and the rules that decide when it is done."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from coordinator.protocol.messages import SamplingParams
from llm_node.detokenizer import IncrementalDetokenizer
from llm_node.kv import SequenceKV
from llm_node.sampling import make_generator, reseed_for_index


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    """Queued; needs a prefill (or, with imported KV, only a decode slot)."""
    RUNNING = "running"
    """Has its KV cache here and gets one token per step."""
    FINISHED = "finished"
    """Done, aborted, or handed off to a decode worker."""


@dataclass(eq=False)
class Sequence:
    """One request's tokens, cache and bookkeeping; owned by the engine, never shared.

    Compared by identity (eq=False): the scheduler removes sequences from its queues by object.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    detokenizer: IncrementalDetokenizer
    mm_embeddings: torch.Tensor | None = None
    """Modality embeddings [n_placeholder_tokens, hidden] in prompt order; None for text-only or once prefilled."""
    positions: torch.Tensor | None = None
    """The prompt's position ids [axes, L] (M-RoPE); None for 0..L-1, and once prefilled."""
    rope_delta: int = 0
    """Generated token n sits at position n + rope_delta (M-RoPE; 0 otherwise)."""
    output_ids: list[int] = field(default_factory=list)
    """Every output token so far, including those produced on a prefill worker before a hand-off."""
    kv: SequenceKV | None = None
    """The KV cache of all tokens but the last output one (which the next decode step feeds)."""
    status: SequenceStatus = SequenceStatus.WAITING
    step_logits: list[torch.Tensor] = field(default_factory=list)
    """float32 logits of each step on this engine, only with sampling.return_logits."""
    finish_reason: str | None = None
    prefill_s: float = 0.0
    """Compute seconds: this sequence's share of the prefill forwards it was in."""
    decode_s: float = 0.0
    """Compute seconds: this sequence's share of the decode forwards it was in."""
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = make_generator(self.sampling.seed)

    @property
    def needs_prefill(self) -> bool:
        return self.kv is None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """What a prefill of this sequence runs over: the prompt, plus the tokens an earlier run already
        produced when this one resumes it (then the next token follows them)."""
        return self.prompt_ids + self.output_ids if self.output_ids else self.prompt_ids

    def next_generator(self) -> torch.Generator:
        """The generator for the next output token (re-seeded per index when the request has a seed)."""
        return reseed_for_index(self.generator, self.sampling.seed, len(self.output_ids))

    def stop_reason(self, token_id: int, eos_ids: frozenset[int], text_stopped: bool) -> str | None:
        """Why the sequence ends after appending `token_id`, or None if it goes on."""
        if text_stopped:
            return "stop"
        if token_id in eos_ids and not self.sampling.ignore_eos:
            return "stop"
        if token_id in self.sampling.stop_token_ids:
            return "stop"
        if len(self.output_ids) >= self.sampling.max_tokens:
            return "length"
        return None
