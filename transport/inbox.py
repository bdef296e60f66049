"""Where verified tensors wait until the receiving worker claims them with recv().

The tcp, ucx and nixl receivers differ in how bytes arrive, not in what happens after: tensors are held
per request until recv() names them (each delivered once), dropped by discard() for an aborted request,
and expired after a TTL so an unclaimed request cannot leak memory. This class is that shared part,
with the same semantics and messages as the local backend's receiver.

Verification happens here, when the engine claims tensors with the descriptors the sender returned: the
ucx and nixl senders compute the CRC32 while the bytes move, so what arrives is stored unverified (its
descriptor has no checksum) and checked against the claimed descriptor's checksum before it is handed
over. send() therefore returns as soon as the bytes are in the receiver's memory, and a damaged transfer
still fails the request (at recv) instead of reaching the engine.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from transport.base import EmbeddingReceiver, TransportError
from transport.checksum import crc32, off_loop
from transport.wire import TensorDescriptor, same_tensor, tensor_bytes

log = logging.getLogger(__name__)


class Inbox:
    """Arrived tensors by request id; all methods run on the receiver's event loop."""

    def __init__(self, where: str, ttl: float) -> None:
        self.where = where
        """The receiver's address, for error messages."""
        self.ttl = ttl
        """Seconds after its last arrival that an unclaimed request is dropped."""
        self._arrived: dict[str, dict[str, tuple[TensorDescriptor, torch.Tensor]]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._closed = False

    @property
    def pending_bytes(self) -> int:
        return sum(d.nbytes for per in self._arrived.values() for d, _ in per.values())

    def store(self, rid: str, tensors: dict[str, tuple[TensorDescriptor, torch.Tensor]]) -> None:
        if self._closed:
            return
        self._arrived.setdefault(rid, {}).update(tensors)
        old = self._expiry.pop(rid, None)
        if old is not None:
            old.cancel()
        self._expiry[rid] = asyncio.get_running_loop().call_later(self.ttl, self._expire, rid)
        event = self._waiters.get(rid)
        if event is not None:
            event.set()

    async def claim(self, descriptors: list[TensorDescriptor], timeout: float) -> dict[str, torch.Tensor]:
        rid = descriptors[0].request_id if descriptors else ""
        if any(d.request_id != rid for d in descriptors) or len({d.name for d in descriptors}) != len(descriptors):
            names = [(d.request_id, d.name) for d in descriptors]
            raise ValueError(f"recv() takes distinct tensors of one request, got {names}")
        event = self._waiters.setdefault(rid, asyncio.Event())
        try:
            async with asyncio.timeout(timeout):
                while not self._has(rid, descriptors):
                    event.clear()
                    await event.wait()
        except TimeoutError:
            raise TransportError(
                f"{rid}: tensors {[d.name for d in descriptors]} did not all arrive at {self.where} within "
                f"{timeout}s (arrived: {sorted(self._arrived.get(rid, {}))}); was the send made to this address, "
                f"and claimed within ttl={self.ttl}s?"
            ) from None
        finally:
            if self._waiters.get(rid) is event:
                del self._waiters[rid]
        per = self._arrived.get(rid, {})
        for d in descriptors:
            got = per[d.name][0]
            if not same_tensor(got, d) or (None not in (got.checksum, d.checksum) and got.checksum != d.checksum):
                raise TransportError(f"{rid}/{d.name}: asked for {d!r} but received {got!r}")
        arrived = {d.name: per.pop(d.name) for d in descriptors}
        if not per:
            self.drop(rid)
        for d in descriptors:
            if d.checksum is not None and arrived[d.name][0].checksum is None:
                await self._verify(d, arrived[d.name][1])
        return {name: t for name, (_, t) in arrived.items()}

    async def _verify(self, d: TensorDescriptor, tensor: torch.Tensor) -> None:
        crc = await off_loop(d.nbytes, crc32, tensor_bytes(tensor))
        if crc != d.checksum:
            raise TransportError(f"{d.request_id}/{d.name}: the bytes at {self.where} have checksum {crc:#x}, the "
                                 f"sender's descriptor says {d.checksum:#x}: damaged or overwritten in transit; "
                                 "fail the request (or send it again)")

    def drop(self, rid: str) -> None:
        self._arrived.pop(rid, None)
        handle = self._expiry.pop(rid, None)
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        """Drop everything and wake every waiting claim, which then fails at once rather than at its timeout."""
        self._closed = True
        for rid in list(self._arrived):
            self.drop(rid)
        for event in self._waiters.values():
            event.set()

    def _has(self, rid: str, descriptors: list[TensorDescriptor]) -> bool:
        if self._closed:
            raise TransportError(f"receiver {self.where} closed while waiting for {rid}")
        per = self._arrived.get(rid, {})
        return all(d.name in per for d in descriptors)

    def _expire(self, rid: str) -> None:
        log.warning("dropping unclaimed tensors %s of %s after %ss", sorted(self._arrived.get(rid, {})), rid, self.ttl)
        self.drop(rid)


class InboxReceiver(EmbeddingReceiver):
    """A receiver that files arrivals in `self._inbox`: claiming, discarding and its gauges are the inbox's."""

    _inbox: Inbox

    @property
    def ttl(self) -> float:
        return self._inbox.ttl

    @property
    def pending_bytes(self) -> int:
        return self._inbox.pending_bytes

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        return await self._inbox.claim(descriptors, timeout)

    async def discard(self, request_id: str) -> None:
        self._inbox.drop(request_id)
