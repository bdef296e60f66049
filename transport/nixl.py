"""The nixl backend: the sender WRITEs one-sidedly from the tensor's own memory into the receiver's pool.

A send: register the tensors' memory, WRITE it into the part of the receiver's registered pool that the
receiver granted this sender, with a notification (Written: descriptors and blocks) that NIXL delivers
after the bytes. send() returns when the WRITE is complete: no copy on the sender, no reply to wait for,
no Python code of the receiver on the path (its NIXL thread does the rest). The CRC32 is computed while
the bytes move (on RDMA the NIC moves them; over cma, the one-host path, the copy runs inside the WRITE
call and the CRC after it) and goes into the returned descriptors; the receiver verifies when the engine
claims the tensors (transport/inbox.py). The receiver gives blocks back with Credit notifications; a
sender whose grant is full waits for them (back-pressure), up to its timeout.

First contact: Hello (our metadata) -> Grant (where in the pool, how much); after a failure the link is
dropped and the next send starts over, which makes the receiver revoke the old grant. With a cluster
secret, Hello, Written and Bye carry an HMAC stamp (transport/auth.py): the receiver grants, files and
revokes nothing for a message without a good one.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from transport.auth import Signer, descs_body
from transport.base import EmbeddingSender, TransportError
from transport.checksum import OFF_LOOP, crc32
from transport.messages import (
    Bye,
    ControlError,
    Credit,
    Grant,
    Hello,
    Written,
    pack,
    unpack,
)
from transport.nixl_agent import NixlAgent, hello_body, parse_address
from transport.nixl_receiver import NixlReceiver
from transport.pool import Runs
from transport.wire import TensorDescriptor, describe

__all__ = ["NixlReceiver", "NixlSender"]
log = logging.getLogger(__name__)
DRAIN_S = 0.001
"""A send takes the receivers' Credits first if it has not for this long (a send whose grant is full always does).
Taking them promptly keeps reusing the same, cache-warm blocks of the receiver's pool."""


@dataclass
class _Link:
    """What a sender knows of one receiver: its agent, its grant, and which granted blocks are in use."""

    name: str
    address: str
    """The receiver's published address, which stamps name."""
    grant: Grant
    runs: Runs
    slots: asyncio.Semaphore
    dead: bool = False

    def block(self, rel: int) -> int:
        return self.grant.start + rel

    def addr(self, rel: int) -> int:
        return self.grant.base + (self.grant.start + rel) * self.grant.block


class NixlSender(EmbeddingSender):
    """WRITEs into receivers' pools; at most `max_inflight` sends per peer at a time."""

    def __init__(self, *, timeout: float = 120.0, max_inflight: int = 4, error_handling: str = "peer",
                 checksum: Literal["crc32", "none"] = "crc32", connect_timeout: float = 10.0,
                 pool_bytes: int | None = None, secret: bytes | None = None, signer: Signer | None = None) -> None:
        self.timeout = timeout
        """Seconds one send may take, waiting for room in the receiver's pool included."""
        self.max_inflight = max_inflight
        self.checksum = checksum
        """"crc32": descriptors carry the CRC32 the receiver checks; "none": dtype, shape and length only."""
        self.connect_timeout = connect_timeout
        """Seconds the first send to a receiver waits for its Grant."""
        del pool_bytes  # accepted for configs written for the old copy-then-READ sender; it has no pool now
        self._signer = signer or (Signer(secret) if secret is not None else None)
        """Stamps Hello, Written and Bye with the cluster secret (transport/auth.py); None: unauthenticated."""
        self._nx = NixlAgent("sender", error_handling=error_handling)
        self._links: dict[str, _Link] = {}
        self._by_name: dict[str, _Link] = {}
        self._grants: dict[str, Grant] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._drained = 0.0

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        if self._nx is None:
            raise TransportError("this nixl sender is closed; make a new one")
        described = [describe(request_id, name, t, checksum=False) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        if time.monotonic() - self._drained > DRAIN_S:
            self._drain()
        link = self._links.get(peer) or await self._connect(peer)
        total = sum(d.nbytes for d in descs)
        if link.grant.max_request and total > link.grant.max_request:
            raise TransportError(f"{peer[:40]}... rejected {request_id}: its {total} bytes exceed the receiver's "
                                 f"unclaimed cap of {link.grant.max_request} bytes per request (max_request_bytes); "
                                 "raise its --transport-max-request-mib or send less per request")
        if sum(link.runs.count(d.nbytes) for d in descs if d.nbytes) > link.runs.blocks:
            raise TransportError(f"{peer[:40]}... rejected {request_id}: its {total} bytes are more than the "
                                 f"{link.runs.nbytes} bytes of the receiver's pool granted to this sender; raise its "
                                 "pool_bytes (or slab_bytes)")
        async with link.slots:
            try:
                async with asyncio.timeout(self.timeout):
                    starts = await self._reserve(link, request_id, descs)
                    crcs = await self._write(link, request_id, described, starts)
            except TimeoutError:
                self._drop(peer)
                raise TransportError(f"{peer[:40]}... did not take {request_id} within {self.timeout}s: its pool stayed "
                                     "full (is the receiving worker claiming its tensors?) or it is gone") from None
            except TransportError:
                self._drop(peer)
                raise
            except Exception as e:  # noqa: BLE001 - NIXL's own error classes, e.g. a disconnected peer
                self._drop(peer)
                raise TransportError(f"sending {request_id} to nixl peer {peer[:40]}... failed: {e!r}; "
                                     "is the receiving worker alive?") from e
        if self.checksum == "none":
            return descs
        return [d.model_copy(update={"checksum": c}) for d, c in zip(descs, crcs, strict=True)]

    async def _write(self, link: _Link, request_id: str, described, starts: list[int]) -> list[int | None]:
        pairs = [(_address(raw), d.nbytes, link.addr(s)) for (d, raw), s in zip(described, starts, strict=True)
                 if d.nbytes]
        what, deadline = f"write of {request_id} to {link.name}", time.monotonic() + self.timeout
        if sum(n for _, n, _ in pairs) >= OFF_LOOP:  # a big copy (cma) or CRC must not stall the event loop
            return await asyncio.to_thread(self._write_sync, link, described, starts, pairs, deadline, what)
        reg, handle, state = self._start(link, pairs)
        try:
            crcs = self._crcs(described)  # while the bytes move (RDMA, TCP); after the copy on cma
            if handle is not None:
                await self._nx.finish(handle, state, deadline, what)
        finally:
            self._end(reg, handle)
        self._nx.agent.send_notif(link.name, self._written(link, described, starts))
        return crcs

    def _written(self, link: _Link, described, starts: list[int]) -> bytes:
        """The notification, stamped once the bytes are there (a stamp's age counts from now)."""
        descs, blocks = [d for d, _ in described], [link.block(s) if s >= 0 else -1 for s in starts]
        stamp = self._signer and self._signer.stamp("send", link.address, descs_body(descs, blocks))
        return pack(Written(descs=descs, starts=blocks, stamp=stamp))

    def _write_sync(self, link: _Link, described, starts, pairs, deadline: float, what: str) -> list:
        reg, handle, _ = self._start(link, pairs)
        try:
            crcs = self._crcs(described)
            if handle is not None:
                self._nx.settle(handle, deadline, what)
        finally:
            self._end(reg, handle)
        self._nx.agent.send_notif(link.name, self._written(link, described, starts))
        return crcs

    def _start(self, link: _Link, pairs):
        """Register the tensors' memory and start the WRITE (over cma the copy happens in this call).

        The notification goes separately, after DONE: attached to the WRITE, NIXL sends it only after the
        transfer's flush, and that flush waited 0.2-0.5 ms for NIXL's threads in 15-40% of 4.5 MB sends
        (measured); sent after DONE, the WRITE came back DONE from this call in 82-99% of them."""
        if not pairs:  # only empty tensors: the notification is all there is to deliver
            return None, None, "DONE"
        reg = self._nx.register(_union([(a, n) for a, n, _ in pairs]))
        try:
            handle, state = self._nx.write(link.name, [(a, n) for a, n, _ in pairs], [(r, n) for _, n, r in pairs])
        except BaseException:
            self._nx.deregister(reg)
            raise
        return reg, handle, state

    def _end(self, reg, handle) -> None:
        if handle is not None:
            self._nx.release(handle)
        if reg is not None:
            self._nx.deregister(reg)

    def _crcs(self, described) -> list[int | None]:
        return [crc32(raw) if self.checksum == "crc32" else None for _, raw in described]

    async def _reserve(self, link: _Link, request_id: str, descs: list[TensorDescriptor]) -> list[int]:
        """Blocks of the grant for each tensor (-1 for empty ones); waits for Credits while the grant is full."""
        delay = 0.0
        while True:
            starts: list[int] = []
            for d in descs:
                s = link.runs.alloc(d.nbytes) if d.nbytes else -1
                if s is None:
                    break
                starts.append(s)
            if len(starts) == len(descs):
                return starts
            for s, d in zip(starts, descs, strict=False):
                if s >= 0:
                    link.runs.free(s, d.nbytes)
            if delay >= 0.05:  # waiting long: make sure the receiver is still there (a dead peer raises here)
                self._nx.agent.send_notif(link.name, pack(Credit()))
            await asyncio.sleep(delay)
            delay = min(0.05, delay * 2 or 1e-4)
            self._drain()
            if link.dead:
                raise TransportError(f"the nixl receiver {link.name} closed while {request_id} waited for room")

    async def _connect(self, peer: str) -> _Link:
        pending = self._connecting.get(peer)
        if pending is None:
            pending = self._connecting[peer] = asyncio.ensure_future(self._hello(peer))
            pending.add_done_callback(lambda _: self._connecting.pop(peer, None))
        return await asyncio.shield(pending)

    async def _hello(self, peer: str) -> _Link:
        info, nx = parse_address(peer), self._nx
        try:
            name = nx.add_peer(info["md"])
            self._grants.pop(name, None)
            md = nx.metadata
            stamp = self._signer and self._signer.stamp("hello", peer, hello_body(md))
            nx.agent.send_notif(name, pack(Hello(metadata=base64.b64encode(md).decode(), stamp=stamp)))
        except Exception as e:  # noqa: BLE001 - NIXL's own error classes
            raise TransportError(f"cannot reach nixl peer {peer[:40]}...: {e!r}; is the receiving worker alive?") from e
        deadline, delay = time.monotonic() + self.connect_timeout, 1e-4
        while (grant := self._grants.pop(name, None)) is None:
            if time.monotonic() > deadline:
                nx.forget(name)
                raise TransportError(f"nixl peer {peer[:40]}... did not answer within {self.connect_timeout}s; "
                                     "is the receiving worker alive, its address current, and the cluster "
                                     "secret the same on both (it ignores an unauthenticated Hello)?")
            await asyncio.sleep(delay)
            delay = min(0.005, delay * 2)
            self._drain()
        if grant.error:
            nx.forget(name)
            raise TransportError(f"nixl peer {peer[:40]}... refused this sender: {grant.error}")
        link = _Link(name, peer, grant, Runs(grant.blocks, grant.block), asyncio.Semaphore(self.max_inflight))
        self._links[peer] = self._by_name[name] = link
        return link

    def _drain(self) -> None:
        """Take Grants, Credits and Byes the receivers sent (NIXL's thread queued them)."""
        self._drained = time.monotonic()
        for name, raw in self._nx.notifs():
            try:
                msg = unpack(raw)
            except ControlError as e:
                log.warning("nixl sender: dropping a notification from %s: %s", name, e)
                continue
            link = self._by_name.get(name)
            if isinstance(msg, Grant):
                self._grants[name] = msg
            elif isinstance(msg, Credit) and link is not None:
                for start, nbytes in msg.runs:
                    link.runs.free(start - link.grant.start, nbytes)
            elif isinstance(msg, Bye) and link is not None:
                link.dead = True
                self._drop(next((p for p, v in self._links.items() if v is link), ""))

    def _drop(self, peer: str) -> None:
        """Forget a failed peer: the next send says Hello again and gets a fresh grant."""
        link = self._links.pop(peer, None)
        if link is not None:
            self._by_name.pop(link.name, None)
            self._nx.forget(link.name)

    async def close(self) -> None:
        for link in self._links.values():
            try:
                stamp = self._signer and self._signer.stamp("bye", link.address, descs_body([]))
                self._nx.agent.send_notif(link.name, pack(Bye(stamp=stamp)))
            except Exception:  # noqa: BLE001 - the receiver is gone already
                pass
        for peer in list(self._links):
            self._drop(peer)
        nx, self._nx = self._nx, None
        if nx is not None:
            await asyncio.to_thread(nx.close)


def _address(raw: memoryview) -> int:
    return np.frombuffer(raw, dtype=np.uint8).ctypes.data


def _union(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping (address, length) runs: NIXL registers each byte once, and two tensors of one
    send may share storage (the same tensor under two names, or views of one buffer)."""
    merged: list[list[int]] = []
    for a, n in sorted(runs):
        if merged and a <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], a + n - merged[-1][0])
        else:
            merged.append([a, n])
    return [(a, n) for a, n in merged]
