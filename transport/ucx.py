"""The ucx backend (ucxx): tag messages between workers that know each other by worker address.

A send is an Offer (descriptors, the sender's address, a fresh tag) on the receiver's well-known offer
tag, then one tag message per tensor on `tag + 1 + i`. The receiver allocates each tensor from its
descriptor and posts a receive straight into it (rendezvous; on one host through posix/sysv shared
memory, see transport/README.md on cma), verifies, and answers a Reply on `tag` over an endpoint it keeps
per sender; a refused send is answered at once and the sender drops the endpoint, cancelling its sends. Every wait has a
deadline; a peer that dies shows up as an error or a missed deadline, and its endpoint is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets

import numpy as np
import torch

from transport.base import EmbeddingReceiver, EmbeddingSender, TransportError
from transport.checksum import off_loop
from transport.inbox import Inbox
from transport.messages import MAX_CONTROL, ControlError, Offer, Reply, pack, unpack
from transport.pool import RecvBuffers
from transport.progress import Pending
from transport.ucx_worker import UcxWorker
from transport.wire import TensorDescriptor, WireError, describe, rebuild

log = logging.getLogger(__name__)

OFFER_TAG = 1
"""Tag of offers; sender tags have a random non-zero high half, so they never collide with it."""
OK, REJECTED = 0, 1


def _refused(reply_buf: np.ndarray) -> bool:
    try:
        reply = unpack(reply_buf)
    except ControlError:
        return False
    return isinstance(reply, Reply) and reply.status != OK


def _array(lib, buf):
    from ucxx._lib.arr import Array  # noqa: PLC0415 - ucxx is imported lazily

    return Array(buf)


class UcxSender(EmbeddingSender):
    """Sends over endpoints kept per receiver address; at most `max_inflight` sends per peer at a time."""

    def __init__(self, *, timeout: float = 120.0, max_inflight: int = 4, error_handling: bool = False,
                 options: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        """Seconds one send may take until the receiver's reply."""
        self.max_inflight = max_inflight
        self._ucx = UcxWorker("ucx-sender", error_handling=error_handling, options=options)
        self._uid = secrets.randbits(31) + 1
        self._seq = itertools.count(1)
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        described = [await off_loop(t.nbytes, describe, request_id, name, t) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        tag = (self._uid << 32) | ((next(self._seq) & 0xFFFFF) << 12)
        if len(descs) >= 1 << 12:
            raise TransportError(f"{request_id}: {len(descs)} tensors in one send; the ucx backend takes at most 4095")
        offer = pack(Offer(reply_to=self._ucx.address, tag=tag, descs=descs))
        reply_buf = np.zeros(MAX_CONTROL, dtype=np.uint8)
        ucx, lib = self._ucx, self._ucx.lib

        def start():
            ep = ucx.endpoint(peer)
            reqs = [ep.tag_recv(_array(lib, reply_buf), lib.UCXXTag(tag)),
                    ep.tag_send(_array(lib, np.frombuffer(offer, dtype=np.uint8)), lib.UCXXTag(OFFER_TAG))]
            for i, (d, raw) in enumerate(described):
                if d.nbytes:
                    reqs.append(ep.tag_send(_array(lib, np.frombuffer(raw, dtype=np.uint8)), lib.UCXXTag(tag + 1 + i)))
            sent = ucx.wait_all(reqs, f"send of {request_id} to {peer[:40]}...", self.timeout,
                                on_fail=lambda: ucx.forget(peer))

            def poll():
                # A refusal comes before the receiver takes the tensors: stop there, and drop the endpoint,
                # which cancels the sends nobody will receive.
                if reqs[0].completed and _refused(reply_buf):
                    ucx.forget(peer)
                    return True, None
                return sent.poll()

            return Pending(poll, sent.deadline, sent.what, sent.cancel)

        async with self._slots.setdefault(peer, asyncio.Semaphore(self.max_inflight)):
            try:
                async with asyncio.timeout(self.timeout + 1):
                    await ucx.run(start)
            except TimeoutError:
                raise TransportError(f"{peer[:40]}... did not confirm {request_id} within {self.timeout}s") from None
        try:
            reply = unpack(reply_buf)
        except ControlError as e:
            raise TransportError(f"{request_id}: unreadable reply from the ucx receiver: {e}") from None
        if not isinstance(reply, Reply) or reply.status != OK:
            raise TransportError(f"{peer[:40]}... rejected {request_id}: {getattr(reply, 'text', reply)}")
        return descs

    async def close(self) -> None:
        await self._ucx.close()


class UcxReceiver(EmbeddingReceiver):
    """Posts a receive for offers, then one receive per offered tensor into a buffer it allocated."""

    def __init__(self, worker_id: str = "", *, ttl: float = 300.0, max_payload: int = 4 << 30,
                 timeout: float = 120.0, error_handling: bool = False, options: dict[str, str] | None = None,
                 pool_bytes: int = 256 << 20) -> None:
        self.worker_id = worker_id
        self._buffers = RecvBuffers(pool_bytes)
        self.max_payload = max_payload
        """Largest total payload of one send in bytes; bigger sends are refused before any tensor moves."""
        self.timeout = timeout
        """Seconds from an offer until all its tensors must have arrived."""
        self._opts = {"error_handling": error_handling, "options": options}
        self._ucx: UcxWorker | None = None
        self._inbox = Inbox("ucx://(not started)", ttl)
        self._offer_buf = np.zeros(MAX_CONTROL, dtype=np.uint8)
        self._offer_req = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def address(self) -> str:
        if self._ucx is None:
            raise TransportError("the ucx receiver has no address before start()")
        return self._ucx.address

    @property
    def ttl(self) -> float:
        return self._inbox.ttl

    @property
    def pending_bytes(self) -> int:
        return self._inbox.pending_bytes

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ucx = UcxWorker(f"ucx-receiver-{self.worker_id}", **self._opts)
        self._inbox.where = self._ucx.address[:48] + "..."
        await self._ucx.run(self._post_offer_recv)
        self._ucx.thread.add_hook(self._offer_hook)

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        return await self._inbox.claim(descriptors, timeout)

    async def discard(self, request_id: str) -> None:
        self._inbox.drop(request_id)

    async def close(self) -> None:
        if self._ucx is not None:
            await self._ucx.close()
        self._inbox.close()

    # --- progress thread: the whole receive path runs here, the event loop only gets finished tensors ---

    def _post_offer_recv(self) -> None:
        lib = self._ucx.lib
        self._offer_req = self._ucx.worker.tag_recv(_array(lib, self._offer_buf), lib.UCXXTag(OFFER_TAG))

    def _offer_hook(self) -> bool:
        req = self._offer_req
        if req is None or not req.completed:
            return False
        frame = bytes(self._offer_buf)
        try:
            req.check_error()
        except Exception as e:  # noqa: BLE001
            log.warning("offer receive at %s failed: %s", self._inbox.where, e)
            frame = b""
        self._post_offer_recv()
        if frame:
            try:
                self._take(frame)
            except Exception:  # noqa: BLE001 - one bad offer must not stop the receiver
                log.exception("could not take an offer at %s", self._inbox.where)
        return True

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
        error = self._check(offer.descs)
        if error:  # answered at once; the sender then drops its endpoint, cancelling the tensors' sends
            self._finish(offer, [], error, None)
            return
        bufs = [self._buffers.take(d.nbytes) for d in offer.descs]
        ep = ucx.endpoint(peer)
        reqs = [ep.tag_recv(_array(lib, np.frombuffer(b, np.uint8)), lib.UCXXTag(offer.tag + 1 + i))
                for i, (d, b) in enumerate(zip(offer.descs, bufs, strict=True)) if d.nbytes]
        pending = ucx.wait_all(reqs, f"tensors of offer {offer.tag:#x}", self.timeout, on_fail=lambda: ucx.forget(peer))
        ucx.thread.watch(pending, lambda result, failed: self._finish(offer, bufs, error, result if failed else None))

    def _finish(self, offer: Offer, bufs: list[memoryview], error: str, failure: BaseException | None) -> None:
        if failure is not None and not error:
            log.warning("receive from a ucx sender failed: %s", failure)
            return  # the sender is gone or broke the transfer; nobody waits for a reply
        tensors, errors = {}, [error] if error else []
        if not error:
            for d, b in zip(offer.descs, bufs, strict=True):
                try:
                    tensors[d.name] = (d, rebuild(d, b))
                except (WireError, RuntimeError, ValueError) as e:
                    errors.append(str(e))
        if not errors and offer.descs:
            self._loop.call_soon_threadsafe(self._inbox.store, offer.descs[0].request_id, tensors)
        ucx, lib, peer = self._ucx, self._ucx.lib, offer.reply_to
        reply = np.frombuffer(pack(Reply(xid=offer.tag, status=REJECTED if errors else OK, text="; ".join(errors))),
                              dtype=np.uint8)
        req = ucx.endpoint(peer).tag_send(_array(lib, reply), lib.UCXXTag(offer.tag))
        pending = ucx.wait_all([req], f"reply to offer {offer.tag:#x}", self.timeout, on_fail=lambda: ucx.forget(peer),
                               result=lambda: reply)  # holds the reply buffer until UCX is done with it
        ucx.thread.watch(pending, lambda r, failed: failed and log.warning("could not answer a sender: %s", r))

    def _check(self, descs: list[TensorDescriptor]) -> str:
        if len({d.request_id for d in descs}) > 1 or len({d.name for d in descs}) != len(descs):
            return f"a send carries distinct tensors of one request, got {[(d.request_id, d.name) for d in descs]}"
        total = sum(d.nbytes for d in descs)
        if total > self.max_payload:
            return f"payload of {total} bytes exceeds max_payload={self.max_payload} of {self._inbox.where}"
        return ""
