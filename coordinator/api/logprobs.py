"""Per-token log-probabilities in OpenAI's shape (`choices[].logprobs.content[]`), from what workers send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.api.schema import ChoiceLogprobs, TokenLogprob, TopLogprob
from coordinator.protocol.logprobs import TokenLogprobs


class LogprobRenderer:
    """Renders one request's TokenLogprobs, decoding each token id once.

    A token's text is what the tokenizer decodes it to alone, and its bytes that text's UTF-8 (as vLLM
    does): a token holding part of a character reads U+FFFD. `tokenizer` is the coordinator's template
    tokenizer, which only ever lends itself to copying (coordinator/tokenizer_pool.py): decoding borrows
    it read-only, so the event loop may decode while prompt threads copy it.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._seen: dict[int, tuple[str, list[int]]] = {}

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._seen:
            text = self.tokenizer.decode([token_id])
            self._seen[token_id] = (text, list(text.encode("utf-8", errors="replace")))
        return self._seen[token_id]

    def entries(self, logprobs: Sequence[TokenLogprobs]) -> list[TokenLogprob]:
        out = []
        for lp in logprobs:
            text, raw = self._token(lp.token_id)
            top = [TopLogprob(token=t, logprob=v, bytes=b) for (t, b), v in
                   ((self._token(i), v) for i, v in lp.top)]
            out.append(TokenLogprob(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top))
        return out

    def choice(self, logprobs: Sequence[TokenLogprobs]) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=self.entries(logprobs))
