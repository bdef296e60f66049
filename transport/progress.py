"""One dedicated thread that owns a UCX worker or a NIXL agent and resolves asyncio futures.

Why a thread of our own: neither library is safe to call from two threads in the mode we use, busy-polling
on the event loop would starve the engine that shares it, and the libraries' own progress threads were slow
on 2 cores (NIXL's: 16 ms per transfer). So every library call runs here: the event loop submits a
function, the thread runs it; if it returns a `Pending`, the thread polls it between progress calls and
resolves the caller's future when it is done. It never spins on the GIL (a thread that re-takes the GIL in
a loop makes the event loop wait up to the 5 ms switch interval for it): between polls it waits in
`idle_wait` (an epoll wait for UCX, a timed select for NIXL), woken at once by a submission; for
`hot_s` after the last activity that wait is only `hot_sleep_s` long, when idle up to `max_sleep_s`.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transport.base import TransportError

log = logging.getLogger(__name__)


@dataclass
class Pending:
    """Work started on the progress thread that finishes later: `poll()` returns (done, result) or raises."""

    poll: Callable[[], tuple[bool, Any]]
    deadline: float
    """time.monotonic() after which the work fails with `what` and `cancel` is called."""
    what: str
    cancel: Callable[[], None] | None = None


class ProgressThread:
    """Runs `progress()` in a loop; `submit(fn)` runs fn on this thread and returns an awaitable result."""

    def __init__(self, name: str, progress: Callable[[], bool], idle_wait: Callable[[float, int], None] | None = None,
                 *, hot_s: float = 0.05, hot_sleep_s: float = 20e-6, max_sleep_s: float = 0.001) -> None:
        self.name = name
        self._progress = progress
        """Advances the library; returns True if it did something (then the thread polls again at once)."""
        self._idle_wait = idle_wait or (lambda timeout, wake_fd: select.select([wake_fd], [], [], timeout))
        """Blocks until the library or the wake-up pipe has an event, or `timeout` seconds pass."""
        self.hot_s = hot_s
        """Seconds after the last activity during which the thread polls every `hot_sleep_s`: a reply is that close."""
        self.hot_sleep_s = hot_sleep_s
        self.max_sleep_s = max_sleep_s
        """Longest idle sleep; bounds the extra latency of an event the library cannot signal."""
        self._inbox: deque[tuple[Callable[[], Any], Callable[[Any, bool], None]]] = deque()
        self._pending: list[tuple[Pending, Callable[[Any, bool], None]]] = []
        self._hooks: list[Callable[[], bool]] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_hook(self, hook: Callable[[], bool]) -> None:
        """Called every iteration on this thread (e.g. to collect notifications); returns True if it found work."""
        self._hooks.append(hook)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run fn on the progress thread; the future gets its result (awaiting a Pending's result if it returns one)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._stop:
            fut.set_exception(TransportError(f"{self.name} is closed"))
            return fut
        self._inbox.append((fn, lambda value, error: _resolve(loop, fut, value, error=error)))
        self.wake()
        return fut

    def watch(self, pending: Pending, done: Callable[[Any, bool], None]) -> None:
        """On this thread only: poll `pending` and call done(result, False) or done(exception, True) here."""
        self._pending.append((pending, done))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full, so the thread wakes anyway

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (within `timeout` seconds); unfinished work fails with a TransportError."""
        self._stop = True
        self.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        for _, settle in [*self._inbox, *self._pending]:
            _settle(settle, TransportError(f"{self.name} closed before the operation finished"), True)
        self._inbox.clear()
        self._pending.clear()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _run(self) -> None:
        _precise_sleeps()
        last_work = time.monotonic()
        while not self._stop:
            busy = self._drain_inbox()
            for step in (self._progress, *self._hooks):
                try:
                    busy |= bool(step())
                except Exception:  # noqa: BLE001 - one failing peer or message must not stop every transfer
                    log.exception("%s: progress step failed", self.name)
                    busy = True
            busy |= self._poll_pending()
            now = time.monotonic()
            if busy:
                last_work = now
            if now - last_work < self.hot_s:
                timeout = 0.0 if busy else self.hot_sleep_s
            else:
                timeout = self.max_sleep_s if self._pending or self._hooks else 0.1
            self._idle_wait(timeout, self._wake_r)
            try:
                os.read(self._wake_r, 4096)
            except (BlockingIOError, OSError):
                pass

    def _drain_inbox(self) -> bool:
        did = False
        while self._inbox:
            fn, settle = self._inbox.popleft()
            did = True
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                _settle(settle, e, True)
                continue
            if isinstance(result, Pending):
                self._pending.append((result, settle))
            else:
                _settle(settle, result, False)
        return did

    def _poll_pending(self) -> bool:
        if not self._pending:
            return False
        now, keep, did = time.monotonic(), [], False
        for item in self._pending:
            pending, settle = item
            try:
                done, result = pending.poll()
            except BaseException as e:  # noqa: BLE001
                _settle(settle, e, True)
                did = True
                continue
            if done:
                _settle(settle, result, False)
                did = True
            elif now > pending.deadline:
                if pending.cancel is not None:
                    try:
                        pending.cancel()
                    except Exception:  # noqa: BLE001 - best effort; the failure below is what matters
                        pass
                _settle(settle, TransportError(f"{pending.what}: no completion by its deadline"), True)
                did = True
            else:
                keep.append(item)
        self._pending = keep
        return did


def _precise_sleeps() -> None:
    """Make this thread's short sleeps last what they ask: Linux adds up to 50 us of timer slack to every
    timed wait, which would turn a 20 us poll interval into 70 us on every hop of every transfer."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 us, for the calling thread only
    except (OSError, AttributeError):
        pass  # not Linux: keep the default


def _settle(settle: Callable[[Any, bool], None], value: Any, error: bool) -> None:
    try:
        settle(value, error)
    except Exception:  # noqa: BLE001 - a failing callback must not stop the thread
        log.exception("progress callback failed")


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, value: Any, *, error: bool = False) -> None:
    def settle() -> None:
        if fut.done():
            return
        if error:
            fut.set_exception(value)
        else:
            fut.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop is closed: nobody is waiting any more
