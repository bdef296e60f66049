"""The nixl receiver: a registered pool that senders WRITE into, each in the part it was granted.

The receiver is off the send path: its NIXL thread takes the bytes and the notifications. Its own work,
on the event loop, is bookkeeping: a short timer (and every recv()) drains the notifications, answers a
Hello with a Grant (a run of pool blocks for that sender), files each Written tensor in the inbox as a
zero-copy view of the pool (or a copy once that sender's grant is more than `lend_limit` held), and
gives blocks back with Credits when the engine drops a tensor. A sender that is gone (a Credit or a
keepalive fails to reach it), reconnects or says Bye loses its grant, whose blocks return to the pool
once the engine has dropped what it still holds of them. With a cluster secret, a Hello, Written or Bye
without a good stamp is dropped and counted: no grant, nothing filed, nothing revoked (transport/auth.py).
An authentic Written that the inbox refuses (over the caps, a discarded request) is credited back at once;
its request's recv() fails with the reason (a one-sided WRITE has no reply to carry it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from transport.admission import Limits, Refused
from transport.auth import descs_body
from transport.base import TransportError
from transport.inbox import Inbox, InboxReceiver
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
from transport.nixl_agent import NixlAgent, hello_body
from transport.pool import BlockPool
from transport.wire import TensorDescriptor, WireError, rebuild

log = logging.getLogger(__name__)
KEEPALIVE_S = 2.0
"""Seconds between liveness probes of each sender holding a grant."""


@dataclass
class _Slab:
    """One sender's grant: pool blocks [start, start + blocks), and what the receiver has done with them."""

    peer: str
    start: int
    blocks: int
    used: int = 0
    """Blocks holding tensors that arrived and are not given back yet."""
    freed: list[tuple[int, int]] = field(default_factory=list)
    """(first block, bytes) runs given back but not yet credited to the sender."""
    revoked: bool = False
    seen: float = field(default_factory=time.monotonic)

    def holds(self, start: int, nblocks: int) -> bool:
        return self.start <= start and start + nblocks <= self.start + self.blocks


class NixlReceiver(InboxReceiver):
    """Grants pool space to senders, files what they write, credits it back when the engine is done."""

    def __init__(self, worker_id: str = "", *, ttl: float = 60.0, timeout: float = 120.0,
                 pool_bytes: int = 256 << 20, slab_bytes: int = 64 << 20, block_bytes: int = 1 << 16,
                 error_handling: str = "peer", lend_limit: float = 0.5, poll_s: float = 0.05,
                 secret: bytes | None = None, max_unclaimed_bytes: int = 1 << 30,
                 max_request_bytes: int = 512 << 20) -> None:
        if pool_bytes < block_bytes:
            raise TransportError(f"pool_bytes={pool_bytes} is smaller than one block ({block_bytes} bytes)")
        self.worker_id = worker_id
        self.timeout = timeout
        """Unused since the receiver takes no part in a transfer; kept so configs stay valid."""
        self.slab_bytes = slab_bytes
        """Most of the pool one sender is granted (less when the pool has less left); the largest tensor it can send."""
        self.lend_limit = lend_limit
        """Largest held share of a sender's grant at which its tensors reach the engine zero-copy; above, copied."""
        self.poll_s = poll_s
        """Seconds between drains of the notifications while nobody waits in recv() (then: every millisecond).
        They answer Hellos and keepalives; arrivals are drained by recv() itself, so this only bounds how long
        a new sender waits for its Grant. (200 drains a second cost 3% of a core here.)"""
        self._error_handling = error_handling
        self._pool = BlockPool(pool_bytes // block_bytes, block_bytes)
        self._nx: NixlAgent | None = None
        self._reg = None
        self._address = ""
        self._inbox = Inbox("nixl://(not started)", Limits(ttl, max_unclaimed_bytes, max_request_bytes), secret)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slabs: dict[str, _Slab] = {}
        """The current grant of each sender, by its agent name."""
        self._retired: list[_Slab] = []
        """Revoked grants whose blocks the engine still holds; back to the pool when it drops them."""
        self._lock = threading.RLock()  # re-entrant: a view's last reference may die (GC) while it is held
        self._flush_due = False
        self._poller: asyncio.Task | None = None
        self._waiting = 0
        self._nudge: asyncio.Future | None = None
        """Set by recv() to wake the poller early (a plain future: 3.11's wait_for can hang when cancelled)."""

    @property
    def address(self) -> str:
        if not self._address:
            raise TransportError("the nixl receiver has no address before start()")
        return self._address

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._nx = await asyncio.to_thread(NixlAgent, f"receiver-{self.worker_id}", error_handling=self._error_handling)
        # Fault the pool's pages in now: a WRITE into untouched pages pays for the page faults on the sender's
        # path (a 4.5 MB WRITE into fresh pages took 3.7 ms instead of 0.8 ms).
        await asyncio.to_thread(self._pool.memory.numpy().fill, 0)
        self._reg = self._nx.register([(self._pool.memory.data_ptr(), self._pool.nbytes)])
        self._address = self._nx.address()  # after registering: the metadata carries the pool's memory key
        self._inbox.bind(self._address, f"nixl agent {self._nx.name}")
        self._poller = asyncio.ensure_future(self._poll())

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        self._drain()  # the notification is normally here long before the descriptors came through Redis
        self._waiting += 1
        if self._nudge is not None and not self._nudge.done():
            self._nudge.set_result(None)  # drain every millisecond while someone waits
        try:
            return await self._inbox.claim(descriptors, timeout)
        finally:
            self._waiting -= 1

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        nx, self._nx = self._nx, None
        if nx is not None:
            for slab in self._slabs.values():
                self._notify(nx, slab.peer, pack(Bye()))
            # The pool stays allocated as long as this object lives: a sender that missed the Bye may still
            # write into it (over cma nothing stops it), and must not hit memory someone else uses.
            await asyncio.to_thread(nx.close)
        self._inbox.close()

    # --- event loop: drain notifications, grant, file arrivals, credit ---

    async def _poll(self) -> None:
        last_probe = time.monotonic()
        loop = asyncio.get_running_loop()
        while True:
            self._nudge = nudge = loop.create_future()
            timer = loop.call_later(0.001 if self._waiting else self.poll_s,
                                    lambda: nudge.done() or nudge.set_result(None))
            try:
                await nudge
            finally:
                timer.cancel()
            try:
                self._drain()
                if time.monotonic() - last_probe > KEEPALIVE_S:
                    last_probe = time.monotonic()
                    self._probe()
            except Exception:  # noqa: BLE001 - one bad sender or message must not stop the receiver
                log.exception("nixl receiver %s: draining notifications failed", self._inbox.where)

    def _drain(self) -> None:
        nx = self._nx
        if nx is None:
            return
        for peer, raw in nx.notifs():
            try:
                msg = unpack(raw)
                if isinstance(msg, Hello):
                    self._hello(nx, peer, msg)
                elif isinstance(msg, Written):
                    self._written(peer, msg)
                elif isinstance(msg, Bye):
                    self._inbox.authenticate("bye", msg.stamp, descs_body([]), f"Bye from {peer}")
                    self._revoke(peer)
                elif isinstance(msg, Credit) and peer in self._slabs:
                    self._slabs[peer].seen = time.monotonic()  # a sender's keepalive
            except (ControlError, Refused) as e:
                log.warning("nixl receiver: dropping a notification from %s: %s", peer, e)
            except Exception:  # noqa: BLE001 - one bad sender must not stop the receiver
                log.exception("nixl receiver: failed on a notification from %s", peer)

    def _hello(self, nx: NixlAgent, peer: str, msg: Hello) -> None:
        metadata = base64.b64decode(msg.metadata)
        # Before anything else: an unauthenticated Hello must not make us connect anywhere or lend memory.
        self._inbox.authenticate("hello", msg.stamp, hello_body(metadata), f"Hello from {peer}")
        self._revoke(peer)  # a sender that says Hello again dropped its old grant
        nx.forget(peer)
        nx.add_peer(metadata)
        pool, size = self._pool, min(self.slab_bytes, self._pool.nbytes)
        while (start := pool.alloc(size)) is None and size > pool.block_bytes:
            size //= 2  # grant what is left, down to one block
        base, limits = pool.memory.data_ptr(), self._inbox.limits
        cap = min(limits.max_request_bytes, limits.max_unclaimed_bytes)
        if start is None:
            error = (f"all {pool.nbytes} bytes of its pool are granted to {len(self._slabs)} other senders; "
                     "raise its pool_bytes (or lower slab_bytes)")
            self._notify(nx, peer, pack(Grant(base=base, block=pool.block_bytes, start=0, blocks=0, error=error)))
            return
        self._slabs[peer] = slab = _Slab(peer, start, pool.count(size))
        grant = Grant(base=base, block=pool.block_bytes, start=start, blocks=slab.blocks, max_request=cap)
        if not self._notify(nx, peer, pack(grant)):
            self._revoke(peer)

    def _written(self, peer: str, msg: Written) -> None:
        slab, pool = self._slabs.get(peer), self._pool
        spans = [(s, pool.count(d.nbytes)) for s, d in zip(msg.starts, msg.descs, strict=False) if d.nbytes]
        granted = (slab is not None and len(msg.starts) == len(msg.descs)
                   and all(slab.holds(s, n) for s, n in spans) and len({d.request_id for d in msg.descs}) <= 1)
        try:
            ticket = self._inbox.admit(msg.descs, msg.stamp, msg.starts, granted=granted)
        except Refused as e:
            log.warning("nixl receiver: refused a Written from %s: %s", peer, e)
            if e.reason in ("over_cap", "unexpected") and granted:  # authentic: its blocks go back to the sender
                self._refund(slab, [(s, d.nbytes) for s, d in zip(msg.starts, msg.descs, strict=True) if d.nbytes])
            return
        slab.seen = time.monotonic()
        tensors = {}
        for start, d in zip(msg.starts, msg.descs, strict=True):
            try:
                tensors[d.name] = (d, rebuild(d, self._take(slab, start, d.nbytes), check=False))
            except (WireError, RuntimeError, ValueError) as e:
                log.warning("nixl receiver: %s/%s from %s: %s", d.request_id, d.name, peer, e)
        if msg.descs and len(tensors) == len(msg.descs):
            self._inbox.store(ticket, tensors)
        else:
            self._inbox.release(ticket)

    def _refund(self, slab: _Slab, runs: list[tuple[int, int]]) -> None:
        """Credit refused arrivals' blocks back to their sender without filing them."""
        with self._lock:
            slab.freed.extend(runs)
            due, self._flush_due = not self._flush_due, True
        if due:
            self._loop.call_soon(self._flush)

    def _take(self, slab: _Slab, start: int, nbytes: int) -> memoryview:
        """The arrived bytes: lent from the pool while the grant is not too held, else copied out of it."""
        if not nbytes:
            return memoryview(bytearray())
        pool = self._pool
        with self._lock:
            slab.used += pool.count(nbytes)
        if slab.used <= self.lend_limit * slab.blocks:
            return pool.lend(start, nbytes, release=lambda s, n, slab=slab: self._give_back(slab, s, n))
        out = memoryview(torch.empty(nbytes, dtype=torch.uint8).numpy())
        np.copyto(np.frombuffer(out, np.uint8), pool.view(start, nbytes).numpy())
        self._give_back(slab, start, nbytes)
        return out

    def _give_back(self, slab: _Slab, start: int, nbytes: int) -> None:
        """Blocks the engine no longer holds (any thread): credit them to the sender soon, in one message."""
        with self._lock:
            slab.used -= self._pool.count(nbytes)
            slab.freed.append((start, nbytes))
            if self._flush_due:
                return
            self._flush_due = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:
            pass  # the loop is closed: nobody will send again

    def _flush(self) -> None:
        self._drain()  # a Bye among them revokes its grant first: no Credit then goes to a closed sender
        due = []
        with self._lock:
            self._flush_due = False
            for slab in [*self._slabs.values(), *self._retired]:
                runs, slab.freed = slab.freed, []
                if runs and not slab.revoked:
                    due.append((slab, runs))
        for slab, runs in due:
            if not self._notify(self._nx, slab.peer, pack(Credit(runs=runs))):
                self._revoke(slab.peer)
        self._reclaim()

    def _probe(self) -> None:
        """Keepalive: a grant whose sender cannot be reached any more is revoked."""
        now = time.monotonic()
        for slab in list(self._slabs.values()):
            if now - slab.seen > KEEPALIVE_S:
                if self._notify(self._nx, slab.peer, pack(Credit())):
                    slab.seen = now
                else:
                    self._revoke(slab.peer)

    def _revoke(self, peer: str) -> None:
        with self._lock:
            slab = self._slabs.pop(peer, None)
            if slab is not None:
                slab.revoked = True
                self._retired.append(slab)
        self._reclaim()

    def _reclaim(self) -> None:
        """Return revoked grants to the pool once nothing in them is held."""
        with self._lock:
            done = [s for s in self._retired if s.used == 0]
            self._retired = [s for s in self._retired if s.used]
        for slab in done:
            self._pool.free(slab.start, slab.blocks * self._pool.block_bytes)

    @staticmethod
    def _notify(nx: NixlAgent | None, peer: str, msg: bytes) -> bool:
        if nx is None:
            return False
        try:
            nx.agent.send_notif(peer, msg)
            return True
        except Exception as e:  # noqa: BLE001 - NIXL raises its own classes for a gone peer
            log.info("nixl receiver: %s unreachable (%s); its grant is revoked", peer, e)
            return False
