"""Where tensors wait until the receiving worker claims them with recv(), and the gate they pass to get there.

The local, tcp, ucx and nixl receivers differ in how bytes arrive, not in what happens around that: a
transfer is first admitted (`admit`: its authentication tag, whether its request was discarded, the caps on
unclaimed memory; transport/auth.py, transport/admission.py), then its tensors are held per request until
recv() names them (each delivered once), dropped by discard() for an aborted request, and expired after
`ttl_s` so an unclaimed request cannot hold memory. This class is that shared part.

Verification of the bytes happens when the engine claims tensors with the descriptors the sender returned:
the ucx and nixl senders compute the CRC32 while the bytes move, so what arrives is stored unverified (its
descriptor has no checksum) and checked against the claimed descriptor's checksum before it is handed
over. send() therefore returns as soon as the bytes are in the receiver's memory, and a damaged transfer
still fails the request (at recv) instead of reaching the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from transport.admission import Limits, ReceiverStats, Refused
from transport.auth import Stamp, Verifier, descs_body
from transport.base import EmbeddingReceiver, TransportError
from transport.checksum import crc32, off_loop
from transport.wire import TensorDescriptor, same_tensor, tensor_bytes

log = logging.getLogger(__name__)
MEMORY = 1 << 16
"""Most request ids remembered as discarded or refused (each for `ttl_s`)."""
REFUSAL_GRACE_S = 0.5
"""How long a claim of a request whose transfer was refused still waits for a newer one before it fails."""


@dataclass
class Ticket:
    """An admitted transfer: its bytes count as unclaimed from admission until it is stored or released."""

    request_id: str
    nbytes: int
    open: bool = True


class Inbox:
    """Admitted and arrived tensors by request id; all methods run on the receiver's event loop."""

    def __init__(self, where: str, limits: Limits | None = None, secret: bytes | None = None) -> None:
        self.where = where
        """The receiver's address (shortened), for error messages."""
        self.limits = limits or Limits()
        self.verifier = Verifier(secret) if secret is not None else None
        """None: no secret, every transfer is taken as authentic (one trusted host only)."""
        self.counts = ReceiverStats()
        self._arrived: dict[str, dict[str, tuple[TensorDescriptor, torch.Tensor]]] = {}
        self._reserved: dict[str, int] = {}
        self._total = 0
        """Unclaimed bytes: stored plus admitted and still arriving."""
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._discarded: OrderedDict[str, float] = OrderedDict()
        self._refusals: OrderedDict[str, tuple[float, str]] = OrderedDict()
        """Why an authentic transfer of a request was refused; a claim of it then fails at once with that."""
        self._closed = False

    @property
    def ttl(self) -> float:
        return self.limits.ttl_s

    @property
    def pending_bytes(self) -> int:
        return sum(d.nbytes for per in self._arrived.values() for d, _ in per.values())

    def bind(self, address: str, where: str | None = None) -> None:
        """The address the receiver publishes (once started): stamps must name it."""
        self.where = where or address
        if self.verifier is not None:
            self.verifier.bind(address)

    def stats(self) -> ReceiverStats:
        return ReceiverStats(**{**self.counts.as_dict(), "unclaimed_bytes": self._total})

    def authenticate(self, kind: str, stamp: Stamp | None, body: bytes, what: str) -> None:
        """Raise Refused (counted) unless the stamp is good; with no secret every message passes."""
        if self.verifier is None:
            return
        try:
            self.verifier.check(kind, stamp, body, what)
        except Refused as e:
            self.counts.count(e.reason)
            raise

    def admit(self, descs: list[TensorDescriptor], stamp: Stamp | None, *extra: object, granted: bool = True) -> Ticket:
        """Admit one transfer before its payload moves (nixl: before it is filed), reserving its bytes; raise
        Refused, counted, for a bad tag, a discarded request or one beyond the caps. `extra` is what the
        stamp covers beyond the descriptors (the backend's own fields); `granted=False`: the backend found
        it outside what the sender may use (nixl: blocks outside its grant)."""
        rid = descs[0].request_id if descs else ""
        what = f"transfer of {rid} {[d.name for d in descs]} to {self.where}"
        self.authenticate("send", stamp, descs_body(descs, *extra), what)
        nbytes, limits = sum(d.nbytes for d in descs), self.limits
        try:
            if not granted:
                raise Refused("unexpected", f"{what}: outside what this sender was granted; dropped")
            if self._recent(self._discarded, rid):
                raise Refused("unexpected", f"{what}: the request was discarded here (aborted); not kept")
            held = sum(d.nbytes for d, _ in self._arrived.get(rid, {}).values()) + self._reserved.get(rid, 0)
            if held + nbytes > limits.max_request_bytes:
                raise Refused("over_cap", f"{what}: {nbytes} bytes on top of {held} unclaimed for the request "
                              f"exceed max_request_bytes={limits.max_request_bytes}; raise the receiver's "
                              "--transport-max-request-mib or send less per request")
            if self._total + nbytes > limits.max_unclaimed_bytes:
                raise Refused("over_cap", f"{what}: {nbytes} bytes on top of {self._total} unclaimed exceed "
                              f"max_unclaimed_bytes={limits.max_unclaimed_bytes}; the receiving worker is not "
                              "claiming (overloaded?) or its --transport-max-unclaimed-mib is too low; retry later")
        except Refused as e:
            self.counts.count(e.reason)
            self._remember(self._refusals, rid, (time.monotonic(), str(e)))
            self._wake(rid)
            raise
        self._reserved[rid] = self._reserved.get(rid, 0) + nbytes
        self._total += nbytes
        return Ticket(rid, nbytes)

    def release(self, ticket: Ticket) -> None:
        """The admitted transfer failed: its reservation goes."""
        if ticket.open:
            ticket.open = False
            self._unreserve(ticket)

    def store(self, ticket: Ticket, tensors: dict[str, tuple[TensorDescriptor, torch.Tensor]]) -> None:
        rid = ticket.request_id
        if self._closed or self._recent(self._discarded, rid) or not ticket.open:
            self.release(ticket)  # discarded while it arrived: nobody will claim it
            return
        ticket.open = False
        self._unreserve(ticket)
        per = self._arrived.setdefault(rid, {})
        for name, (d, _) in tensors.items():
            old = per.get(name)
            self._total += d.nbytes - (old[0].nbytes if old else 0)
        per.update(tensors)
        self.counts.accepted += 1
        self._refusals.pop(rid, None)
        old = self._expiry.pop(rid, None)
        if old is not None:
            old.cancel()
        self._expiry[rid] = asyncio.get_running_loop().call_later(self.ttl, self._expire, rid)
        self._wake(rid)

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
                    if (refused := self._recent(self._refusals, rid)) is None:
                        await event.wait()
                        continue
                    try:  # a retry of the refused transfer may be on its way (nixl: its notification trails)
                        async with asyncio.timeout(REFUSAL_GRACE_S):
                            await event.wait()
                    except TimeoutError:
                        raise TransportError(f"{rid}: its tensors were refused on arrival: {refused[1]}") from None
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
        self._total -= sum(d.nbytes for d, _ in arrived.values())
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

    def discard(self, rid: str) -> None:
        """Drop an aborted request's tensors and refuse what still comes for it within `ttl_s`."""
        self._remember(self._discarded, rid, time.monotonic())
        self.drop(rid)

    def drop(self, rid: str) -> None:
        per = self._arrived.pop(rid, None)
        if per:
            self._total -= sum(d.nbytes for d, _ in per.values())
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

    def _unreserve(self, ticket: Ticket) -> None:
        left = self._reserved.get(ticket.request_id, 0) - ticket.nbytes
        if left > 0:
            self._reserved[ticket.request_id] = left
        else:
            self._reserved.pop(ticket.request_id, None)
        self._total -= ticket.nbytes

    def _wake(self, rid: str) -> None:
        event = self._waiters.get(rid)
        if event is not None:
            event.set()

    def _remember(self, memory: OrderedDict, rid: str, value) -> None:
        memory.pop(rid, None)
        memory[rid] = value
        while len(memory) > MEMORY:
            memory.popitem(last=False)

    def _recent(self, memory: OrderedDict, rid: str):
        """The remembered value for rid if it is younger than `ttl_s`, else None (and forgotten)."""
        value = memory.get(rid)
        if value is None:
            return None
        at = value[0] if isinstance(value, tuple) else value
        if time.monotonic() - at > self.ttl:
            del memory[rid]
            return None
        return value

    def _expire(self, rid: str) -> None:
        log.warning("dropping unclaimed tensors %s of %s after %ss", sorted(self._arrived.get(rid, {})), rid, self.ttl)
        self.counts.expired += 1
        self.drop(rid)


class InboxReceiver(EmbeddingReceiver):
    """A receiver that files arrivals in `self._inbox`: admission, claiming, discarding and its gauges are the
    inbox's."""

    _inbox: Inbox

    @property
    def ttl(self) -> float:
        return self._inbox.ttl

    @property
    def pending_bytes(self) -> int:
        return self._inbox.pending_bytes

    def stats(self) -> ReceiverStats:
        return self._inbox.stats()

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        return await self._inbox.claim(descriptors, timeout)

    async def discard(self, request_id: str) -> None:
        self._inbox.discard(request_id)
