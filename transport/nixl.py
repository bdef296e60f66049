"""The nixl backend: the receiver READs one-sidedly from the sender's registered pool; notifications say when.

A send: the sender copies the tensors into its own registered pool and posts a notification naming the
blocks (Posted); the receiver READs them into its own registered pool, verifies, hands copies to its
inbox and answers Reply, after which the sender reuses its blocks. Two notifications and one transfer
per send (a WRITE would need the receiver to grant room first: one round trip more). The sender's
metadata and pool layout reach the receiver in a Hello notification; the receiver's metadata is in the
address it publishes in the Redis registry. The receive path runs on the progress thread; every wait
has a deadline; a dead peer is a NIXL error or a missed deadline, and its blocks are released.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging

import numpy as np
import torch

from transport.base import EmbeddingReceiver, EmbeddingSender, TransportError
from transport.checksum import off_loop
from transport.inbox import Inbox
from transport.messages import ControlError, Hello, Posted, Reply, pack, unpack
from transport.nixl_agent import NixlAgent, parse_address
from transport.wire import TensorDescriptor, WireError, describe, rebuild

log = logging.getLogger(__name__)
OK, REJECTED = 0, 1


class NixlSender(EmbeddingSender):
    """Posts from its own registered pool; at most `max_inflight` sends per peer at a time."""

    def __init__(self, *, timeout: float = 120.0, max_inflight: int = 4, pool_bytes: int = 128 << 20,
                 error_handling: str = "peer") -> None:
        self.timeout = timeout
        """Seconds one send may take until the receiver's reply."""
        self.max_inflight = max_inflight
        self._nx = NixlAgent("sender", pool_bytes=pool_bytes, error_handling=error_handling)
        self._nx.thread.add_hook(self._on_notifs)
        self._nx.thread.start()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._peers: dict[str, str] = {}
        self._waiting: dict[int, asyncio.Future] = {}
        self._xids = itertools.count(1)
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        self._loop = asyncio.get_running_loop()
        described = [await off_loop(t.nbytes, describe, request_id, name, t) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        async with self._slots.setdefault(peer, asyncio.Semaphore(self.max_inflight)):
            try:
                async with asyncio.timeout(self.timeout):
                    reply = await self._send(peer, request_id, descs, described)
            except TimeoutError:
                self._drop(peer)
                raise TransportError(f"{peer[:40]}... did not confirm {request_id} within {self.timeout}s; "
                                     "is the receiving worker alive?") from None
            except TransportError:
                self._drop(peer)
                raise
            except Exception as e:  # noqa: BLE001 - NIXL's own error classes, e.g. a disconnected peer
                self._drop(peer)
                raise TransportError(f"sending {request_id} to nixl peer {peer[:40]}... failed: {e!r}; "
                                     "is the receiving worker alive?") from e
        if reply.status != OK:
            raise TransportError(f"{peer[:40]}... rejected {request_id}: {reply.text}")
        return descs

    async def _send(self, peer: str, request_id: str, descs, described) -> Reply:
        nx = self._nx
        name = await self._connect(peer)
        xid, starts = next(self._xids), []
        try:
            for d, raw in described:
                start = nx.pool.alloc(d.nbytes)
                if start is None:
                    raise TransportError(f"{request_id}: {d.nbytes} bytes do not fit the free part of the sender's "
                                         f"pool ({nx.pool.blocks * nx.pool.block_bytes} bytes); raise pool_bytes")
                starts.append(start)
                if d.nbytes:  # numpy, not torch: torch's copy may wait on its OpenMP pool when the cores are busy
                    dst = nx.pool.view(start, d.nbytes).numpy()
                    await off_loop(d.nbytes, np.copyto, dst, np.frombuffer(raw, np.uint8))
            replied = self._waiting[xid] = asyncio.get_running_loop().create_future()
            notif = pack(Posted(xid=xid, descs=descs, blocks=starts))
            await nx.thread.submit(lambda: nx.agent.send_notif(name, notif))
            return await replied
        finally:
            self._waiting.pop(xid, None)
            for s, d in zip(starts, descs, strict=False):
                nx.pool.free(s, d.nbytes)  # the receiver has read them (or failed, or the deadline passed)

    async def _connect(self, peer: str) -> str:
        name = self._peers.get(peer)
        if name is None:
            info, nx = parse_address(peer), self._nx
            hello = pack(Hello(metadata=base64.b64encode(nx.metadata).decode(), base=nx.pool.memory.data_ptr(),
                               block=nx.pool.block_bytes, blocks=nx.pool.blocks))

            def connect() -> str:
                remote = nx.add_peer(info["md"])
                nx.agent.send_notif(remote, hello)
                return remote

            name = self._peers[peer] = await nx.thread.submit(connect)
        return name

    def _drop(self, peer: str) -> None:
        """Forget a failed peer so the next send reconnects (a restarted worker publishes a new address anyway)."""
        name = self._peers.pop(peer, None)
        if name is not None:
            self._nx.thread.submit(lambda: self._nx.forget(name))

    def _on_notifs(self) -> bool:  # progress thread
        got = self._nx.notifs()
        if got and self._loop is not None:
            self._loop.call_soon_threadsafe(self._dispatch, got)
        return bool(got)

    def _dispatch(self, got: list[tuple[str, bytes]]) -> None:
        for _, raw in got:
            try:
                msg = unpack(raw)
            except ControlError as e:
                log.warning("nixl sender: %s", e)
                continue
            fut = self._waiting.pop(getattr(msg, "xid", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def close(self) -> None:
        await asyncio.to_thread(self._nx.close)


class NixlReceiver(EmbeddingReceiver):
    """READs posted tensors into its registered pool, verifies them and hands copies to its inbox."""

    def __init__(self, worker_id: str = "", *, ttl: float = 300.0, timeout: float = 120.0,
                 pool_bytes: int = 256 << 20, error_handling: str = "peer", lend_limit: float = 0.5) -> None:
        self.worker_id = worker_id
        self.timeout = timeout
        """Seconds one READ may take; a sender that died mid-way fails it."""
        self.lend_limit = lend_limit
        """Largest used share of the pool at which received tensors stay in it (zero-copy); above, they are copied."""
        self._opts = {"pool_bytes": pool_bytes, "error_handling": error_handling}
        self._nx: NixlAgent | None = None
        self._inbox = Inbox("nixl://(not started)", ttl)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._senders: dict[str, Hello] = {}

    @property
    def address(self) -> str:
        if self._nx is None:
            raise TransportError("the nixl receiver has no address before start()")
        return self._nx.address()

    @property
    def ttl(self) -> float:
        return self._inbox.ttl

    @property
    def pending_bytes(self) -> int:
        return self._inbox.pending_bytes

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._nx = await asyncio.to_thread(NixlAgent, f"receiver-{self.worker_id}", **self._opts)
        self._inbox.where = f"nixl agent {self._nx.name}"
        self._nx.thread.add_hook(self._on_notifs)
        self._nx.thread.start()

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        return await self._inbox.claim(descriptors, timeout)

    async def discard(self, request_id: str) -> None:
        self._inbox.drop(request_id)

    async def close(self) -> None:
        if self._nx is not None:
            await asyncio.to_thread(self._nx.close)
        self._inbox.close()

    # --- progress thread: the whole receive path runs here ---

    def _on_notifs(self) -> bool:
        got = self._nx.notifs()
        for peer, raw in got:
            try:
                self._handle(peer, unpack(raw))
            except ControlError as e:
                log.warning("nixl receiver: dropping a notification from %s: %s", peer, e)
            except Exception:  # noqa: BLE001 - one bad sender must not stop the receiver
                log.exception("nixl receiver: failed on a notification from %s", peer)
        return bool(got)

    def _handle(self, peer: str, msg) -> None:
        nx = self._nx
        if isinstance(msg, Hello):
            nx.forget(peer)  # a sender that reconnects may have a new pool
            nx.add_peer(base64.b64decode(msg.metadata))
            self._senders[peer] = msg
        elif isinstance(msg, Posted):
            hello = self._senders.get(peer)
            error = "" if hello else f"no Hello from {peer} before its transfer"
            starts: list[int] = []
            for d in msg.descs if not error else []:
                start = nx.pool.alloc(d.nbytes)
                if start is None:
                    error = (f"{sum(d.nbytes for d in msg.descs)} bytes do not fit the free part of the receiver's "
                             f"pool ({nx.pool.blocks * nx.pool.block_bytes} bytes); raise its pool_bytes")
                    break
                starts.append(start)
            if error or len(msg.blocks) != len(msg.descs):
                self._release(starts, msg.descs)
                self._reply(peer, msg.xid, error or "blocks and descriptors differ in number")
                return
            moved = [(s, b, d) for s, b, d in zip(starts, msg.blocks, msg.descs, strict=True) if d.nbytes]
            if any(b < 0 or (b + nx.pool.count(d.nbytes)) * hello.block > hello.blocks * hello.block
                   for _, b, d in moved):
                self._release(starts, msg.descs)
                self._reply(peer, msg.xid, f"blocks {msg.blocks} lie outside the sender's pool of {hello.blocks}")
                return
            if not moved:
                self._finish(peer, msg, starts, None)
                return
            here = nx.pool.memory.data_ptr()
            local = [(here + s * nx.pool.block_bytes, d.nbytes) for s, _, d in moved]
            remote = [(hello.base + b * hello.block, d.nbytes) for _, b, d in moved]
            what = f"read of {msg.descs[0].request_id} from {peer}"
            pending = nx.xfer("READ", peer, local, remote, what, self.timeout)
            nx.thread.watch(pending, lambda r, failed: self._finish(peer, msg, starts, r if failed else None))

    def _finish(self, peer: str, msg: Posted, starts: list[int], failure: BaseException | None) -> None:
        if failure is not None:
            self._release(starts, msg.descs)
            log.warning("nixl receiver: %s", failure)
            return  # the sender is gone: nobody waits for the reply
        tensors, errors, pool = {}, [], self._nx.pool
        lend = pool.used_fraction <= self.lend_limit
        for s, d in zip(starts, msg.descs, strict=False):
            if lend and d.nbytes:  # zero-copy: the blocks come back when the engine drops the tensor
                raw = pool.lend(s, d.nbytes)
            else:  # the pool is filling up with tensors the engine holds: copy, and reuse the blocks at once
                raw = memoryview(torch.empty(d.nbytes, dtype=torch.uint8).numpy())
                np.copyto(np.frombuffer(raw, np.uint8), pool.view(s, d.nbytes).numpy())
                pool.free(s, d.nbytes)
            try:
                tensors[d.name] = (d, rebuild(d, raw))
            except (WireError, RuntimeError, ValueError) as e:
                errors.append(str(e))
        if not errors and msg.descs:
            self._loop.call_soon_threadsafe(self._inbox.store, msg.descs[0].request_id, tensors)
        self._reply(peer, msg.xid, "; ".join(errors))

    def _release(self, starts: list[int], descs: list[TensorDescriptor]) -> None:
        for s, d in zip(starts, descs, strict=False):
            self._nx.pool.free(s, d.nbytes)

    def _reply(self, peer: str, xid: int, error: str) -> None:
        try:
            self._nx.agent.send_notif(peer, pack(Reply(xid=xid, status=REJECTED if error else OK, text=error)))
        except Exception as e:  # noqa: BLE001 - the sender is gone
            log.warning("nixl receiver: could not answer %s: %s", peer, e)
