"""The ucx backend (ucxx): tag messages between workers that know each other by worker address.

A send is an Offer (descriptors, the sender's address, a fresh tag) on the receiver's well-known offer
tag, then one tag message per tensor on `tag + 1 + i`, straight from the tensor's memory. The receiver
takes a buffer per tensor from its pool, posts a receive into it and answers a Reply at once (accepted,
or refused with the reason before any tensor moves); on one host UCX then moves each tensor with one
cross-memory-attach copy into that buffer. send() returns when the Reply came and UCX completed every
tensor's send, i.e. the bytes are in the receiver's buffers. The sender computes the CRC32 meanwhile, and
the receiver checks it when the engine claims the tensors (transport/inbox.py). Both ends run on their
event loop (transport/ucx_worker.py); every wait has a deadline, and a failed peer's endpoint is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from typing import Literal

import numpy as np
import torch

from transport.admission import Limits, Refused
from transport.auth import Signer, descs_body
from transport.base import EmbeddingSender, TransportError
from transport.checksum import crc32, off_loop
from transport.inbox import Inbox, InboxReceiver, Ticket
from transport.messages import MAX_CONTROL, ControlError, Offer, Reply, pack, unpack
from transport.pool import RecvBuffers
from transport.ucx_worker import UcxWorker, array
from transport.wire import TensorDescriptor, WireError, describe, rebuild

log = logging.getLogger(__name__)

OFFER_TAG = 1
"""Tag of offers; sender tags have a random non-zero high half, so they never collide with it."""
OK, REJECTED = 0, 1


class UcxSender(EmbeddingSender):
    """Sends over endpoints kept per receiver address; at most `max_inflight` sends per peer at a time."""

    def __init__(self, *, timeout: float = 120.0, max_inflight: int = 4, error_handling: bool = False,
                 options: dict[str, str] | None = None, checksum: Literal["crc32", "none"] = "crc32",
                 secret: bytes | None = None, signer: Signer | None = None) -> None:
        self.timeout = timeout
        """Seconds one send may take until the receiver has the bytes."""
        self.max_inflight = max_inflight
        self.checksum = checksum
        """"crc32": descriptors carry the CRC32 the receiver checks; "none": dtype, shape and length only."""
        self._opts = {"error_handling": error_handling, "options": options}
        self._signer = signer or (Signer(secret) if secret is not None else None)
        """Stamps each offer with the cluster secret (transport/auth.py); None: unauthenticated."""
        self._ucx: UcxWorker | None = None
        self._uid = secrets.randbits(31) + 1
        self._seq = itertools.count(1)
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        if len(tensors) >= 1 << 12:
            raise TransportError(f"{request_id}: {len(tensors)} tensors in one send; the ucx backend takes at most 4095")
        ucx = self._ucx = self._ucx or UcxWorker(**self._opts)
        described = [describe(request_id, name, t, checksum=False) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        tag = (self._uid << 32) | ((next(self._seq) & 0xFFFFF) << 12)
        stamp = self._signer and self._signer.stamp("send", peer, descs_body(descs, tag, ucx.address))
        offer = np.frombuffer(pack(Offer(reply_to=ucx.address, tag=tag, descs=descs, stamp=stamp)), dtype=np.uint8)
        reply_buf = np.zeros(MAX_CONTROL, dtype=np.uint8)
        lib = ucx.lib
        async with self._slots.setdefault(peer, asyncio.Semaphore(self.max_inflight)):
            ep = ucx.endpoint(peer)
            replied = ucx.wait([ep.tag_recv(array(reply_buf), lib.UCXXTag(tag))], f"reply from {peer[:40]}...",
                               self.timeout, keep=reply_buf)
            sends = [ep.tag_send(array(offer), lib.UCXXTag(OFFER_TAG))]
            sends += [ep.tag_send(array(raw), lib.UCXXTag(tag + 1 + i))
                      for i, (d, raw) in enumerate(described) if d.nbytes]
            sent = ucx.wait(sends, f"send of {request_id} to {peer[:40]}...", self.timeout,
                            keep=(offer, described), on_fail=lambda: ucx.forget(peer))
            ucx.progress()  # push the offer and the rendezvous requests out before the CRC runs
            try:
                crcs = await self._crcs(described)  # while the receiver copies the bytes
                reply = await self._reply(replied, reply_buf, request_id, peer)
                if reply.status != OK:
                    ucx.forget(peer)  # cancels the sends nobody will receive
                    raise TransportError(f"{peer[:40]}... rejected {request_id}: {reply.text}")
                await sent
            finally:
                for f in (replied, sent):
                    if not f.done():
                        f.cancel()
                    elif not f.cancelled():
                        f.exception()  # retrieved: a failure after the one raised is not news
        return [d.model_copy(update={"checksum": c}) for d, c in zip(descs, crcs, strict=True)]

    async def _crcs(self, described) -> list[int | None]:
        if self.checksum == "none":
            return [None] * len(described)
        return [await off_loop(d.nbytes, crc32, raw) for d, raw in described]

    @staticmethod
    async def _reply(replied: asyncio.Future, buf: np.ndarray, request_id: str, peer: str) -> Reply:
        await replied
        try:
            reply = unpack(buf)
        except ControlError as e:
            raise TransportError(f"{request_id}: unreadable reply from the ucx receiver {peer[:40]}...: {e}") from None
        if not isinstance(reply, Reply):
            raise TransportError(f"{request_id}: the ucx receiver {peer[:40]}... answered a {reply.kind} message")
        return reply

    async def close(self) -> None:
        if self._ucx is not None:
            self._ucx.close()


class UcxReceiver(InboxReceiver):
    """Keeps a receive posted for offers; per offer, posts one receive per tensor into its pool and accepts."""

    def __init__(self, worker_id: str = "", *, ttl: float = 60.0, max_payload: int = 4 << 30,
                 timeout: float = 120.0, error_handling: bool = False, options: dict[str, str] | None = None,
                 pool_bytes: int = 256 << 20, secret: bytes | None = None, max_unclaimed_bytes: int = 1 << 30,
                 max_request_bytes: int = 512 << 20) -> None:
        self.worker_id = worker_id
        self._buffers = RecvBuffers(pool_bytes)
        self.max_payload = max_payload
        """Largest total payload of one send in bytes; bigger sends are refused before any tensor moves."""
        self.timeout = timeout
        """Seconds from an offer until all its tensors must have arrived."""
        self._opts = {"error_handling": error_handling, "options": options}
        self._ucx: UcxWorker | None = None
        self._inbox = Inbox("ucx://(not started)", Limits(ttl, max_unclaimed_bytes, max_request_bytes), secret)
        self._offer_buf = np.zeros(MAX_CONTROL, dtype=np.uint8)
        self._offer_req = None

    @property
    def address(self) -> str:
        if self._ucx is None:
            raise TransportError("the ucx receiver has no address before start()")
        return self._ucx.address

    async def start(self) -> None:
        self._ucx = UcxWorker(**self._opts)
        self._inbox.bind(self._ucx.address, self._ucx.address[:48] + "...")
        # Fault the pool in now, so the first transfers do not pay for page faults on the sender's path.
        await asyncio.to_thread(self._buffers.pool.memory.numpy().fill, 0)
        self._post_offer_recv()
        self._ucx.add_hook(self._offers)

    async def close(self) -> None:
        if self._ucx is not None:
            self._ucx.close()
        self._inbox.close()

    def _post_offer_recv(self) -> None:
        lib = self._ucx.lib
        self._offer_req = self._ucx.worker.tag_recv(array(self._offer_buf), lib.UCXXTag(OFFER_TAG))

    def _offers(self) -> None:
        """Progress hook: take every offer that arrived, reposting the offer receive after each."""
        while self._offer_req is not None and self._offer_req.completed:
            req, frame = self._offer_req, bytes(self._offer_buf)
            self._post_offer_recv()
            try:
                req.check_error()
                self._take(frame)
            except Exception:  # noqa: BLE001 - one bad offer must not stop the receiver
                log.exception("could not take an offer at %s", self._inbox.where)

    def _take(self, frame: bytes) -> None:
        try:
            offer = unpack(frame)
        except ControlError as e:
            log.warning("dropping an unreadable offer at %s: %s", self._inbox.where, e)
            return
        if not isinstance(offer, Offer):
            log.warning("dropping a %s message on the offer tag", offer.kind)
            return
        ucx, lib, peer = self._ucx, self._ucx.lib, offer.reply_to
        ep = ucx.endpoint(peer)
        error, ticket = self._check(offer.descs), None
        if not error:
            try:  # before any receive is posted: a refused offer moves no tensor byte
                ticket = self._inbox.admit(offer.descs, offer.stamp, offer.tag, offer.reply_to)
            except Refused as e:
                error = str(e)
                log.warning("refused an offer at %s: %s", self._inbox.where, e)
        bufs = [] if error else [self._buffers.take(d.nbytes) for d in offer.descs]
        reqs = [ep.tag_recv(array(np.frombuffer(b, np.uint8)), lib.UCXXTag(offer.tag + 1 + i))
                for i, (d, b) in enumerate(zip(offer.descs, bufs, strict=False)) if d.nbytes]
        reply = np.frombuffer(pack(Reply(xid=offer.tag, status=REJECTED if error else OK, text=error)), np.uint8)
        answered = ucx.wait([ep.tag_send(array(reply), lib.UCXXTag(offer.tag))], f"reply to offer {offer.tag:#x}",
                            self.timeout, keep=reply, on_fail=lambda: ucx.forget(peer))
        answered.add_done_callback(lambda f: f.cancelled() or f.exception() is None or log.warning(
            "could not answer a ucx sender: %s", f.exception()))
        if error:
            return
        got = ucx.wait(reqs, f"tensors of offer {offer.tag:#x}", self.timeout, keep=bufs,
                       on_fail=lambda: ucx.forget(peer))
        got.add_done_callback(lambda f: self._arrived(offer, ticket, bufs, f))

    def _arrived(self, offer: Offer, ticket: Ticket, bufs: list[memoryview], done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None:
            log.warning("receive from a ucx sender failed: %s", "closed" if done.cancelled() else done.exception())
            self._inbox.release(ticket)
            return  # the sender is gone or broke the transfer
        tensors = {}
        for d, b in zip(offer.descs, bufs, strict=True):
            try:
                tensors[d.name] = (d, rebuild(d, b, check=False))  # verified when claimed
            except (WireError, RuntimeError, ValueError) as e:
                log.warning("dropping %s/%s: %s", d.request_id, d.name, e)
                self._inbox.release(ticket)
                return
        if offer.descs:
            self._inbox.store(ticket, tensors)
        else:
            self._inbox.release(ticket)

    def _check(self, descs: list[TensorDescriptor]) -> str:
        if len({d.request_id for d in descs}) > 1 or len({d.name for d in descs}) != len(descs):
            return f"a send carries distinct tensors of one request, got {[(d.request_id, d.name) for d in descs]}"
        total = sum(d.nbytes for d in descs)
        if total > self.max_payload:
            return f"payload of {total} bytes exceeds max_payload={self.max_payload} of {self._inbox.where}"
        return ""
