"""Copies of one tokenizer, lent to one thread at a time, so prompts are tokenized in parallel.

A fast tokenizer must not be called from two threads at once: each call borrows its Rust object
mutably to set truncation and padding, and a second thread's call fails with "Already borrowed".
One lock around one tokenizer avoids that but makes every request wait behind the longest prompt
being tokenized. The pool hands each `PromptBuilder.build` thread its own copy instead.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_POOL_SIZE = 8
"""Copies at most. A build waits for a copy only while this many others are tokenizing, and each holds
its copy for as long as --max-prompt-chars of text takes to tokenize (about 2 s at the default)."""


class TokenizerPool:
    """Lends copies of `tokenizer`, made on first need (a server without concurrent requests holds one).

    The tokenizer passed in is only ever copied, never called here, so other code may keep using it.
    """

    def __init__(self, tokenizer: Any, size: int = DEFAULT_POOL_SIZE):
        if size < 1:
            raise ValueError(f"a tokenizer pool needs at least one copy, got size={size}")
        self._template = tokenizer
        self._size = size
        self._made = 0
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _made only; never held while tokenizing

    @property
    def copies(self) -> int:
        """Copies made so far."""
        return self._made

    @contextmanager
    def borrow(self) -> Iterator[Any]:
        """A tokenizer no other thread uses until the block ends."""
        tok = self._take()
        try:
            yield tok
        finally:
            self._free.put(tok)

    def _take(self) -> Any:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            make = self._made < self._size
            self._made += make
        # Copying reads the template, which nobody tokenizes with, so it runs outside the lock.
        return copy.deepcopy(self._template) if make else self._free.get()
