"""A UCX worker (ucxx) progressed by the asyncio event loop, woken by UCX's own event fd.

Why on the loop and not on a thread of our own: every hop between a progress thread and the loop costs a
wake-up and a GIL hand-over (0.1-0.2 ms each on a loaded 2-core machine, several per send), and a thread
that polls on a timer is late by its period. Here the loop watches the worker's epoll fd (UCX "blocking
progress mode"): when UCX has an event, the loop progresses the worker, resolves the futures of finished
requests directly and re-arms the fd; when it has none, nobody polls. The workers' engines run their
steps in threads, so the loop stays free to do this. Endpoints are made from the peer's worker address
(published in the registry), not through a listener: a listener's connection goes over TCP even on one
host, an address-based endpoint picks shared memory when the peer is local.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.base import TransportError

_ucxx: Any = None
SAFE_TLS = "self,tcp"
"""Transports used unless UCX_TLS (or options["TLS"]) says otherwise. UCX's shared-memory transports have no
peer-failure handling: with cma a sender that dies mid-transfer aborts the receiving process
("process_vm_readv ... No such process"), and with posix/sysv a sender killed mid-flood left the
receiver's shared receive FIFO stalled, so a new sender's offer went unanswered (2 of 6 runs of the
contract test that kills a sender; 0 of 8 with tcp only). A dead encode worker must not wedge a prefill
worker, so the default is tcp even on one host; set UCX_TLS (e.g. self,sm,tcp) to trade that for speed."""


RNDV_SCHEME = "put_zcopy"
"""Rendezvous protocol for large tag messages unless UCX_RNDV_SCHEME says otherwise. UCX's automatic choice
moved 4.5 MB over TCP at 45-54 % of raw TCP; with the sender PUTting the bytes, 101 % (the ucxx data plane
alone: 154 %, as NIXL's WRITE over TCP), measured with benchmarks/transport.py."""


def _lib() -> Any:
    global _ucxx  # the import is slow and optional: do it once, on first use
    if _ucxx is None:
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        try:
            import ucxx._lib.libucxx as lib  # noqa: PLC0415
        except ImportError as e:
            raise TransportError(f"the ucx transport needs ucxx: pip install ucxx-cu12 ({e})") from e
        _ucxx = lib
    return _ucxx


def array(buf) -> Any:
    """A ucxx buffer over `buf` (anything with the buffer protocol), without a copy."""
    from ucxx._lib.arr import Array  # noqa: PLC0415 - ucxx is imported lazily

    return Array(buf)


def encode_address(raw: bytes) -> str:
    return "ucx://" + base64.urlsafe_b64encode(raw).decode()


def decode_address(address: str) -> bytes:
    scheme, sep, rest = address.partition("://")
    if scheme != "ucx" or not sep or not rest:
        raise TransportError(f"the ucx transport takes ucx://<worker address> addresses, got {address[:40]!r}")
    try:
        return base64.urlsafe_b64decode(rest)
    except ValueError as e:
        raise TransportError(f"malformed ucx address {address[:40]!r}...: {e}") from None


@dataclass
class _Wait:
    requests: list[Any]
    future: asyncio.Future
    what: str
    keep: Any
    """Buffers UCX reads or writes until the requests finish; held here so they cannot be freed early."""
    timer: asyncio.TimerHandle | None = None


class UcxWorker:
    """One ucp worker on the running event loop, its endpoints by peer address, and its pending waits."""

    def __init__(self, *, error_handling: bool = False, options: dict[str, str] | None = None) -> None:
        lib = _lib()
        self.lib = lib
        self.error_handling = error_handling
        """Peer-failure handling on endpoints. UCX's shared-memory transports cannot do it, so turning it on
        sends same-host traffic over TCP; off, a dead peer is caught by the deadlines instead."""
        config = dict(options or {})
        if "UCX_TLS" not in os.environ:
            config.setdefault("TLS", SAFE_TLS)
        if "UCX_RNDV_SCHEME" not in os.environ:
            config.setdefault("RNDV_SCHEME", RNDV_SCHEME)
        self.context = lib.UCXContext(config_dict=config, feature_flags=(lib.Feature.TAG, lib.Feature.WAKEUP))
        self.worker = lib.UCXWorker(self.context)
        self.worker.init_blocking_progress_mode()
        self.address = encode_address(self.worker.address.tobytes())
        self._fd = self.worker.epoll_file_descriptor
        self._endpoints: dict[str, Any] = {}
        self._waits: list[_Wait] = []
        self._hooks: list[Callable[[], None]] = []
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self.progress)
        self._scheduled = False
        self.closed = False

    def add_hook(self, hook: Callable[[], None]) -> None:
        """Run `hook` after every progress pass (the receiver checks for offers there)."""
        self._hooks.append(hook)

    def progress(self) -> None:
        """Progress UCX until idle, settle finished waits, run hooks, and re-arm the event fd."""
        self._scheduled = False
        if self.closed:
            return
        for _ in range(10_000):  # bounded, so a flood cannot starve the rest of the loop
            if not self.worker.progress_once():
                break
        for hook in self._hooks:
            hook()
        if self._waits:
            self._settle()
        if not self.worker.arm():  # events arrived meanwhile: go again soon, after the loop's other work
            self.soon()

    def soon(self) -> None:
        """Progress on the next loop iteration (after posting requests that UCX completes without an event)."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.progress)

    def wait(self, requests: list[Any], what: str, timeout: float, keep: Any = None,
             on_fail: Callable[[], None] | None = None) -> asyncio.Future:
        """A future that resolves when every request completed (or fails with the first error, or at the
        deadline, calling `on_fail`, e.g. to drop the endpoint and so cancel what is still in flight)."""
        w = _Wait(requests, self._loop.create_future(), what, keep)
        w.timer = self._loop.call_later(timeout, self._expire, w, on_fail, timeout)
        w.future.add_done_callback(lambda f, w=w: self._forget(w, on_fail))
        self._waits.append(w)
        self.soon()
        return w.future

    def _settle(self) -> None:
        keep = []
        for w in self._waits:
            if w.future.done():
                continue
            if not all(r.completed for r in w.requests):
                keep.append(w)
                continue
            try:
                for r in w.requests:
                    r.check_error()
            except Exception as e:  # noqa: BLE001 - ucxx raises its own exception classes
                w.future.set_exception(TransportError(f"{w.what}: {e}"))
                continue
            w.future.set_result(None)
        self._waits = keep

    def _expire(self, w: _Wait, on_fail, timeout: float) -> None:
        if not w.future.done():
            w.future.set_exception(TransportError(f"{w.what}: not complete within {timeout}s; is the peer alive?"))

    def _forget(self, w: _Wait, on_fail) -> None:
        if w.timer is not None:
            w.timer.cancel()
        if w in self._waits:
            self._waits.remove(w)
        if (w.future.cancelled() or w.future.exception() is not None) and on_fail is not None:
            on_fail()

    def endpoint(self, address: str) -> Any:
        ep = self._endpoints.get(address)
        if ep is None:
            raw = decode_address(address)
            try:
                ucx_addr = self.lib.UCXAddress.create_from_buffer(np.frombuffer(raw, dtype=np.uint8))
                ep = self.worker.create_endpoint_from_worker_address(ucx_addr, self.error_handling)
            except Exception as e:  # noqa: BLE001 - ucxx raises its own exception classes
                raise TransportError(f"cannot reach ucx peer {address[:40]}...: {e}; is it on a reachable host "
                                     "and does it share a transport (UCX_TLS) with this one?") from e
            self._endpoints[address] = ep
        return ep

    def forget(self, address: str) -> None:
        """Close the endpoint to a peer that failed, cancelling its requests; the next send makes a new one."""
        ep = self._endpoints.pop(address, None)
        if ep is not None:
            try:
                ep.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            self.soon()

    def close(self) -> None:
        """Drop every endpoint and stop watching the fd; pending waits fail now rather than at their deadline."""
        for address in list(self._endpoints):
            self.forget(address)
        for w in list(self._waits):
            if not w.future.done():
                w.future.set_exception(TransportError(f"{w.what}: the ucx worker closed"))
        self.closed = True
        self._loop.remove_reader(self._fd)
