"""A UCX worker (ucxx) driven by one ProgressThread, with endpoints kept per peer address.

Shared by the ucx sender and receiver. Every ucxx call happens on the progress thread; callers submit
functions through `run`. Endpoints are made from the peer's worker address (published in the registry),
not through a listener: a listener's connection goes over TCP even on one host, an address-based endpoint
picks shared memory when the peer is local.
"""

from __future__ import annotations

import asyncio
import base64
import os
import select
import time
from collections.abc import Callable
from typing import Any

from transport.base import TransportError
from transport.progress import Pending, ProgressThread

_ucxx: Any = None
SAFE_TLS = "self,posix,sysv,tcp"
"""Transports used unless UCX_TLS is set. Without peer-failure handling (which UCX's shared-memory transports
lack), cma aborts the whole process when its peer dies mid-transfer (process_vm_readv: No such process);
posix/sysv shared memory and tcp report the failure instead, so they are the default."""


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


class UcxWorker:
    """One ucp worker, its progress thread and its endpoints."""

    def __init__(self, name: str, *, error_handling: bool = False, options: dict[str, str] | None = None) -> None:
        lib = _lib()
        self.lib = lib
        self.error_handling = error_handling
        """Peer-failure handling on endpoints. UCX's shared-memory transports cannot do it, so turning it on
        sends same-host traffic over TCP; off, a dead peer is caught by the deadlines instead."""
        config = dict(options or {})
        if "UCX_TLS" not in os.environ:
            config.setdefault("TLS", SAFE_TLS)
        self.context = lib.UCXContext(config_dict=config,
                                      feature_flags=(lib.Feature.TAG, lib.Feature.WAKEUP))
        self.worker = lib.UCXWorker(self.context)
        self.worker.init_blocking_progress_mode()
        self._epoll_fd = self.worker.epoll_file_descriptor
        self.address = encode_address(self.worker.address.tobytes())
        self._endpoints: dict[str, Any] = {}
        self.thread = ProgressThread(name, self._progress, self._idle_wait)
        self.thread.start()

    def _progress(self) -> bool:
        did = False
        for _ in range(64):  # bounded: let submissions and hooks run between bursts
            if not self.worker.progress_once():
                break
            did = True
        return did

    def _idle_wait(self, timeout: float, wake_fd: int) -> None:
        if self.worker.arm():  # armed: nothing pending, so the epoll fd will signal the next event
            select.select([self._epoll_fd, wake_fd], [], [], timeout)

    def run(self, fn: Callable[[], Any]):
        return self.thread.submit(fn)

    # --- below: called on the progress thread only ---

    def endpoint(self, address: str) -> Any:
        ep = self._endpoints.get(address)
        if ep is None:
            raw = decode_address(address)
            import numpy as np  # noqa: PLC0415

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

    def wait_all(self, requests: list[Any], what: str, timeout: float, on_fail: Callable[[], None] | None = None,
                 result: Callable[[], Any] = lambda: None) -> Pending:
        def poll() -> tuple[bool, Any]:
            if not all(r.completed for r in requests):
                return False, None
            for r in requests:
                try:
                    r.check_error()
                except Exception as e:  # noqa: BLE001
                    if on_fail is not None:
                        on_fail()
                    raise TransportError(f"{what}: {e}") from e
            return True, result()

        return Pending(poll, time.monotonic() + timeout, what, on_fail)

    async def close(self) -> None:
        def shut() -> None:
            for address in list(self._endpoints):
                self.forget(address)

        try:
            async with asyncio.timeout(5):
                await self.thread.submit(shut)
        except (TimeoutError, TransportError):
            pass
        await asyncio.to_thread(self.thread.stop)
