"""The ucx and nixl data planes alone, as the backends use them but without descriptors, checksums,
registration per send or bookkeeping, so the benchmark can tell the link's cost from the contract's.

ucx: a tag send from a pre-allocated buffer into a receive the echo side keeps posted, answered by a
one-byte tag message (the backend's offer/reply/tensor exchange without the offer). nixl: a one-sided
WRITE from a pre-registered buffer through descriptor lists prepared once, then its notification (the
backend's send without registering the tensor, without the CRC and without the bookkeeping).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np

from transport.nixl_agent import NixlAgent
from transport.ucx_worker import UcxWorker, array

DATA, ACK = 7, 8


class UcxEcho:
    """Keeps a receive of up to `size` bytes posted; answers each arrival with a one-byte ACK."""

    def __init__(self, size: int) -> None:
        self.ucx = UcxWorker()
        self.buf, self.ack = np.empty(max(size, 1), np.uint8), np.zeros(1, np.uint8)
        self.peer, self.req = "", None

    def start(self, peer: str) -> None:
        self.peer = peer
        self._post()
        self.ucx.add_hook(self._hook)

    def _post(self) -> None:
        self.req = self.ucx.worker.tag_recv(array(self.buf), self.ucx.lib.UCXXTag(DATA))

    def _hook(self) -> None:
        while self.req is not None and self.req.completed:
            self.req.check_error()
            self._post()
            self.ucx.endpoint(self.peer).tag_send(array(self.ack), self.ucx.lib.UCXXTag(ACK))


class UcxPing:
    def __init__(self) -> None:
        self.ucx = UcxWorker()
        self.ack = np.zeros(1, np.uint8)

    async def send(self, peer: str, data: np.ndarray, timeout: float = 30.0) -> None:
        ep, lib = self.ucx.endpoint(peer), self.ucx.lib
        reqs = [ep.tag_recv(array(self.ack), lib.UCXXTag(ACK)), ep.tag_send(array(data), lib.UCXXTag(DATA))]
        self.ucx.progress()
        await self.ucx.wait(reqs, "ping", timeout, keep=data)


class NixlTarget:
    """A registered buffer of `size` bytes that the pinger WRITEs into; its notifications are drained."""

    def __init__(self, size: int) -> None:
        self.nx = NixlAgent("target")
        self.buf = np.zeros(max(size, 1), np.uint8)
        self.reg = self.nx.register([(self.buf.ctypes.data, self.buf.nbytes)])

    def address(self) -> str:
        info = {"md": base64.b64encode(self.nx.metadata).decode(), "base": self.buf.ctypes.data}
        return base64.urlsafe_b64encode(json.dumps(info).encode()).decode()

    async def serve(self, done: asyncio.Event) -> None:
        while not done.is_set():
            self.nx.notifs()
            await asyncio.sleep(0.05)


class NixlPinger:
    """WRITEs `n` bytes of a pre-registered buffer with a notification, through prepared descriptor lists."""

    def __init__(self, data: np.ndarray) -> None:
        self.nx = NixlAgent("pinger")
        self.data = data
        self.reg = self.nx.register([(data.ctypes.data, data.nbytes)])
        self.peer, self.local, self.remote, self.sizes = "", None, None, {}

    def connect(self, target: str, sizes: list[int]) -> None:
        info = json.loads(base64.urlsafe_b64decode(target))
        agent = self.nx.agent
        self.peer = self.nx.add_peer(base64.b64decode(info["md"]))
        self.sizes = {n: i for i, n in enumerate(sizes)}
        self.local = agent.prep_xfer_dlist("", [(self.data.ctypes.data, n, 0) for n in sizes], "DRAM")
        self.remote = agent.prep_xfer_dlist(self.peer, [(info["base"], n, 0) for n in sizes], "DRAM")

    async def send(self, n: int, timeout: float = 30.0) -> None:
        agent, i = self.nx.agent, self.sizes[n]
        handle = agent.make_prepped_xfer("WRITE", self.local, [i], self.remote, [i])
        try:
            await self.nx.finish(handle, agent.transfer(handle), time.monotonic() + timeout, "nixl data plane write")
        finally:
            self.nx.release(handle)
        agent.send_notif(self.peer, b"w")  # after DONE, as the backend does (see transport/nixl.py)
