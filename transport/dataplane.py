"""The ucx and nixl data planes alone: the backends' own worker/agent and progress thread, without
descriptors, checksums or copies, so the benchmark can tell the link's cost from the contract's.

An echo pair per library. The sender moves `n` bytes from a pre-registered (nixl) or pre-allocated (ucx)
buffer; the echo side gets them into its own pre-allocated buffer and answers one small message; the
sender's future resolves on that answer. ucx: tag send into a posted receive. nixl: the same flow as the
backend: a notification, a one-sided READ by the echo side, a notification back.
"""

from __future__ import annotations

import asyncio

import numpy as np

from transport.nixl_agent import NixlAgent, parse_address
from transport.ucx_worker import UcxWorker

DATA, ACK = 7, 8


def _arr(buf):
    from ucxx._lib.arr import Array  # noqa: PLC0415 - ucxx is imported lazily

    return Array(buf)


class UcxEcho:
    """Keeps a receive of up to `size` bytes posted; answers each arrival with a one-byte ACK."""

    def __init__(self, size: int) -> None:
        self.ucx = UcxWorker("ucx-echo")
        self.buf, self.ack = np.empty(size, np.uint8), np.zeros(1, np.uint8)
        self.peer: str | None = None
        self.req = None

    async def start(self, peer: str) -> None:
        self.peer = peer
        await self.ucx.run(self._post)
        self.ucx.thread.add_hook(self._hook)

    def _post(self) -> None:
        self.req = self.ucx.worker.tag_recv(_arr(self.buf), self.ucx.lib.UCXXTag(DATA))

    def _hook(self) -> bool:  # progress thread
        if self.req is None or not self.req.completed:
            return False
        self.req.check_error()
        self._post()
        self.ucx.endpoint(self.peer).tag_send(_arr(self.ack), self.ucx.lib.UCXXTag(ACK))
        return True


class UcxPing:
    def __init__(self) -> None:
        self.ucx = UcxWorker("ucx-ping")
        self.ack = np.zeros(1, np.uint8)

    async def send(self, peer: str, data: np.ndarray, timeout: float = 30.0) -> None:
        ucx, lib = self.ucx, self.ucx.lib

        def start():
            ep = ucx.endpoint(peer)
            reqs = [ep.tag_recv(_arr(self.ack), lib.UCXXTag(ACK)), ep.tag_send(_arr(data), lib.UCXXTag(DATA))]
            return ucx.wait_all(reqs, "ping", timeout)

        await ucx.run(start)


class NixlEcho:
    """On a notification naming `n` bytes, READs them from the pinger's pool into its own, then answers."""

    def __init__(self, size: int) -> None:
        self.nx = NixlAgent("echo", pool_bytes=max(size, 1 << 16))
        self.nx.thread.start()
        self.remote = None

    async def start(self, ping_address: str) -> None:
        info = parse_address(ping_address)

        def connect() -> None:
            self.peer = self.nx.add_peer(info["md"])
            self.remote = info["base"]

        await self.nx.thread.submit(connect)
        self.nx.thread.add_hook(self._hook)

    def _hook(self) -> bool:  # progress thread
        got = self.nx.notifs()
        for peer, msg in got:
            n = int(msg)
            here = self.nx.pool.memory.data_ptr()
            pending = self.nx.xfer("READ", peer, [(here, n)], [(self.remote, n)], "echo read", 30.0)
            self.nx.thread.watch(pending, lambda r, failed, p=peer: self.nx.agent.send_notif(p, b"ack"))
        return bool(got)


class NixlPing:
    def __init__(self, size: int) -> None:
        self.nx = NixlAgent("ping", pool_bytes=max(size, 1 << 16))
        self.nx.thread.add_hook(self._hook)
        self.nx.thread.start()
        self.waiting: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _hook(self) -> bool:  # progress thread
        got = self.nx.notifs()
        if got and self.loop is not None:
            self.loop.call_soon_threadsafe(self._wake)
        return bool(got)

    def _wake(self) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(None)

    async def connect(self, echo_address: str) -> None:
        info = parse_address(echo_address)
        self.peer = await self.nx.thread.submit(lambda: self.nx.add_peer(info["md"]))

    async def send(self, n: int, timeout: float = 30.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.waiting = self.loop.create_future()
        msg = str(n).encode()
        await self.nx.thread.submit(lambda: self.nx.agent.send_notif(self.peer, msg))
        await asyncio.wait_for(self.waiting, timeout)

