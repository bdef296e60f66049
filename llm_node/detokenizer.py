"""Incremental detokenization with stop strings.

Text is produced as deltas that concatenate to the decoded output. Two things are held back:
- a trailing U+FFFD, because a multi-byte character may be split across tokens (byte-level BPE) and
  decodes as the replacement character until its last byte arrives;
- a tail of the text that is the start of some stop string, because the next token may complete it.
When a stop string appears, the text before it is emitted and the string itself (and everything
after it) is not.

The state is a deterministic function of the tokens pushed one by one, so a decode worker that
replays the tokens a prefill worker already produced reaches the very same state and continues
the stream without repeating or losing text.
"""

from __future__ import annotations

from dataclasses import dataclass

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5
"""Prompt tokens decoded as context, so tokenizers that drop a leading space on a first token do not."""


@dataclass
class DetokenizerDelta:
    """What one push produced."""

    text: str
    """New text safe to emit."""
    stopped: bool
    """A stop string matched; the request should finish with reason "stop"."""


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas; one per request."""

    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (), skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = tuple(s for s in stop if s)
        context = list(prompt_ids[-_PROMPT_CONTEXT:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.text = ""
        """All text decoded so far (cut at the stop string once one matched)."""
        self._emitted = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _decode_new(self, final: bool) -> str:
        """Text that the pending tokens add to the context, or "" while a character is incomplete."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def push(self, token_ids: list[int]) -> DetokenizerDelta:
        """Add output tokens; return the text that is now safe to emit."""
        if self.stopped:
            return DetokenizerDelta("", True)
        self._ids.extend(token_ids)
        return self._advance(self._decode_new(final=False))

    def flush(self) -> str:
        """The request is finishing for another reason: emit everything held back, incomplete chars included."""
        if self.stopped:
            return ""
        new = self._decode_new(final=True)
        self.text += new
        delta = self.text[self._emitted :]
        self._emitted = len(self.text)
        return delta

    def _advance(self, new: str) -> DetokenizerDelta:
        if not new:
            return DetokenizerDelta("", False)
        start = len(self.text)
        self.text += new
        longest = max((len(s) for s in self._stop), default=0)
        # Only a match overlapping the new text is new; earlier text was checked before.
        window = max(0, start - longest + 1)
        hits = [i for i in (self.text.find(s, window) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            delta = self.text[self._emitted :]
            self._emitted = len(self.text)
            return DetokenizerDelta(delta, True)
        safe = len(self.text) - self._stop_prefix_len()
        delta = self.text[self._emitted : safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        return DetokenizerDelta(delta, False)

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
