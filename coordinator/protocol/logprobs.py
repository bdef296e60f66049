"""Per-token log-probabilities: what engines report (TokenLogprobs) and how a TokenEvent carries them
(PackedLogprobs), compactly, from the LLM worker to the coordinator."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's and vLLM's default cap on top_logprobs)."""


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's log-probability and the most likely tokens at its step, as every engine reports
    them (StepOutput.logprobs): log_softmax in float32 of the raw logits the token was sampled from, before
    temperature and top_p (vLLM's default, `raw_logprobs`), so they describe the model, not the sampler."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """The SamplingParams.logprobs most likely tokens as (token id, logprob), most likely first; the
    generated token is among them only if it is that likely."""


_F32 = struct.Struct("<f")


class PackedLogprobs(BaseModel):
    """The TokenLogprobs of one event's tokens in few bytes: float32 values in base64 (5.3 characters a value,
    against ~19 for a JSON float) and the top ids as one flat list; the generated ids are the event's."""

    k: int = Field(ge=0, le=MAX_TOP_LOGPROBS)
    """Alternatives per token."""
    values: str
    """base64 little-endian float32; per token its own logprob, then its k alternatives' in order."""
    top_ids: list[int] = []
    """Per token, its k alternatives' ids, most likely first."""

    @classmethod
    def pack(cls, items: Sequence[TokenLogprobs]) -> PackedLogprobs:
        k = len(items[0].top) if items else 0
        if any(len(t.top) != k for t in items):
            raise ValueError(f"every token of an event needs the same number of alternatives, got "
                             f"{[len(t.top) for t in items]}")
        floats = [v for t in items for v in (t.logprob, *(lp for _, lp in t.top))]
        return cls(k=k, values=base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode(),
                   top_ids=[i for t in items for i, _ in t.top])

    @property
    def count(self) -> int:
        """Tokens described (what the values and ids hold; TokenEvent checks it against its token_ids)."""
        n_bytes = len(base64.b64decode(self.values))
        if n_bytes % (_F32.size * (1 + self.k)) or len(self.top_ids) != n_bytes // _F32.size // (1 + self.k) * self.k:
            raise ValueError(f"{n_bytes} bytes of values and {len(self.top_ids)} ids do not describe whole tokens "
                             f"with k={self.k}")
        return n_bytes // _F32.size // (1 + self.k)

    def unpack(self, token_ids: Sequence[int]) -> list[TokenLogprobs]:
        raw = base64.b64decode(self.values)
        floats = struct.unpack(f"<{len(raw) // _F32.size}f", raw)
        k, out = self.k, []
        for n, token in enumerate(token_ids):
            row, ids = floats[n * (1 + k):(n + 1) * (1 + k)], self.top_ids[n * k:(n + 1) * k]
            out.append(TokenLogprobs(token_id=token, logprob=row[0], top=tuple(zip(ids, row[1:]))))
        return out

    def tail(self, skip: int) -> PackedLogprobs:
        """Without the first `skip` tokens (an event trimmed of tokens already accepted)."""
        raw = base64.b64decode(self.values)[skip * (1 + self.k) * _F32.size:]
        return PackedLogprobs(k=self.k, values=base64.b64encode(raw).decode(), top_ids=self.top_ids[skip * self.k:])
