"""The lanes of the transport benchmark: each moves bytes to its own child process, one transfer at a time.

A lane is a limit (single-copy shared memory, raw TCP), a backend (its sender here, its receiver in the
child, which claims every tensor with recv() and the descriptors send() returned, as a worker would), or
a library's bare data plane (transport/dataplane.py). The benchmark interleaves the lanes transfer by
transfer, so on a shared machine every lane sees the same load. Children: `python -m
benchmarks.transport_lanes KIND ...`; each prints one JSON line with what the parent needs, then serves
until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import torch

from transport.registry import make_receiver, make_sender
from transport.wire import TensorDescriptor

ROOT = Path(__file__).resolve().parents[1]


def tensor(size: int) -> torch.Tensor:
    return torch.arange(size, dtype=torch.int64).to(torch.uint8)


@contextmanager
def environ(env: dict):
    """Set env while a sender is made (UCX reads UCX_TLS when its context is created)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


class Lane:
    """One way of moving `size` bytes; `once` returns the seconds of one transfer."""

    def __init__(self, name: str, path: str, child: list[str], env: dict | None = None) -> None:
        self.name, self.path, self.env = name, path, env or {}
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.transport_lanes", *child], cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    async def hello(self) -> dict:
        return json.loads(await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 180))

    async def open(self, sizes: list[int]) -> None: ...

    async def once(self, size: int, i: int) -> float: ...

    async def close(self) -> None:
        try:
            self.proc.stdin.close()
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)
        except (TimeoutError, OSError):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class ShmLane(Lane):
    """The single-copy limit on one host: copy into a mapped shared segment, a one-byte pipe ping-pong."""

    def __init__(self, sizes: list[int]) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=max(sizes))
        super().__init__("limit:shm", "host", ["shm", self.shm.name])
        self.seg = np.ndarray((max(sizes),), dtype=np.uint8, buffer=self.shm.buf)
        self.src: dict[int, np.ndarray] = {}

    async def open(self, sizes: list[int]) -> None:
        self.src = {s: tensor(s).numpy() for s in sizes}

    async def once(self, size: int, i: int) -> float:
        t0 = time.perf_counter()
        np.copyto(self.seg[:size], self.src[size])
        os.write(self.proc.stdin.fileno(), b"g")
        os.read(self.proc.stdout.fileno(), 1)
        return time.perf_counter() - t0

    async def close(self) -> None:
        await super().close()
        del self.seg
        self.shm.close()
        self.shm.unlink()


class RawTcpLane(Lane):
    """The network limit: sendall of the bytes, the child reads them with recv_into, a one-byte reply."""

    def __init__(self) -> None:
        super().__init__("limit:rawtcp", "tcp", ["rawtcp"])
        self.sock: socket.socket | None = None
        self.src: dict[int, memoryview] = {}

    async def open(self, sizes: list[int]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", (await self.hello())["port"]), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # one buffer per size: an 8-byte length, then the payload, so one sendall moves a message
        self.src = {s: memoryview(s.to_bytes(8, "little") + tensor(s).numpy().tobytes()) for s in sizes}

    async def once(self, size: int, i: int) -> float:
        ack = bytearray(1)
        t0 = time.perf_counter()
        self.sock.sendall(self.src[size])
        self.sock.recv_into(ack)
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        await super().close()


class BackendLane(Lane):
    """send() of one backend; the child's receiver claims each tensor with the descriptors it returned."""

    def __init__(self, name: str, path: str, kind: str, env: dict | None = None, **opts) -> None:
        super().__init__(name, path, ["backend", kind], env)
        self.kind, self.opts = kind, opts
        self.sender, self.address, self.src = None, "", {}
        self.last_recv_s: float | None = None
        """Seconds the last claim took in the child (recv(): waiting, checking the CRC32, handing over)."""

    async def open(self, sizes: list[int]) -> None:
        self.address = (await self.hello())["address"]
        with environ(self.env):
            self.sender = make_sender(self.kind, timeout=120.0, **self.opts)
        self.src = {s: tensor(s) for s in sizes}

    async def once(self, size: int, i: int) -> float:
        t0 = time.perf_counter()
        descs = await self.sender.send(self.address, f"{size}-{i}", {"x": self.src[size]})
        took = time.perf_counter() - t0
        self.proc.stdin.write((json.dumps([d.model_dump() for d in descs]) + "\n").encode())
        self.proc.stdin.flush()  # the control plane: the child claims with exactly these descriptors
        # Wait until it has (untimed): the next lane must not share the machine with this claim.
        self.last_recv_s = json.loads(await asyncio.to_thread(self.proc.stdout.readline))["recv_s"]
        return took

    async def close(self) -> None:
        if self.sender is not None:  # first: every tensor is claimed already, and the peer must still be there
            await self.sender.close()
        await super().close()


class DataplaneLane(Lane):
    """The library's bare data plane (transport/dataplane.py) into the child."""

    def __init__(self, name: str, path: str, lib: str, size: int, env: dict | None = None) -> None:
        super().__init__(name, path, ["dataplane", lib, str(size)], env)
        self.lib, self.ping, self.data = lib, None, None

    async def open(self, sizes: list[int]) -> None:
        from transport.dataplane import (  # optional packages: imported when used
            NixlPinger,
            UcxPing,
        )

        address = (await self.hello())["address"]
        self.data = tensor(max(sizes)).numpy()
        with environ(self.env):  # UCX reads UCX_TLS when the worker or agent is made, here
            self.ping = UcxPing() if self.lib == "ucx" else NixlPinger(self.data)
        if self.lib == "ucx":
            self.address = address
            self.proc.stdin.write((self.ping.ucx.address + "\n").encode())
            self.proc.stdin.flush()
            await self.hello()
        else:
            self.ping.connect(address, sizes)

    async def once(self, size: int, i: int) -> float:
        t0 = time.perf_counter()
        await (self.ping.send(self.address, self.data[:size]) if self.lib == "ucx" else self.ping.send(size))
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self.lib == "ucx" and self.ping is not None:
            self.ping.ucx.close()
        await super().close()


class HostedLane(Lane):
    """A lane whose sending side runs in a LaneHost process; only its name lives here."""

    def __init__(self, host: LaneHost, name: str) -> None:
        self.host, self.name, self.path = host, name, name.rsplit(":", 1)[1]
        self.last_recv_s: float | None = None

    async def open(self, sizes: list[int]) -> None:
        await self.host.ready()

    async def once(self, size: int, i: int) -> float:
        got = await self.host.call({"lane": self.name, "size": size, "i": i})
        self.last_recv_s = got["recv_s"]
        return got["took"]

    async def close(self) -> None:
        await self.host.close()


class LaneHost:
    """One process for the sending sides of one library's lanes (ucx or nixl).

    ucxx and NIXL each load their own copy of UCX; in one process the second copy's transports are
    crippled (NIXL's 4.5 MB WRITE went from 1.3 ms to 11 ms once ucxx was loaded beside it). Workers load
    one backend each, so the benchmark keeps the libraries apart the same way."""

    def __init__(self, backends: list[str], sizes: list[int], names: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.transport_lanes", "host",
                                      json.dumps({"backends": backends, "sizes": sizes, "names": names})],
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._ready: asyncio.Future | None = None

    async def _readline(self, timeout: float = 300) -> dict:
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line:
            raise RuntimeError(f"lane host exited (rc={self.proc.wait(10)}); its stderr is above")
        return json.loads(line)

    async def ready(self) -> None:
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._readline())
        await self._ready

    async def call(self, msg: dict) -> dict:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        return await self._readline()

    async def close(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.close()
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 60)
        except (TimeoutError, OSError):
            self.proc.kill()
            self.proc.wait(10)


# ---------------------------------------------------------------- child side


async def child_host(spec: str) -> None:
    """Open the named lanes here, then run one transfer per request line; the timing is taken here."""
    from benchmarks.transport import make_lanes  # late: that module imports this one

    cfg = json.loads(spec)
    lanes = dict(zip(cfg["names"], make_lanes(cfg["backends"], cfg["sizes"], cfg["names"]), strict=True))
    out = sys.stdout
    sys.stdout = sys.stderr  # the libraries' chatter must not mix with the replies
    try:
        await asyncio.gather(*(lane.open(cfg["sizes"]) for lane in lanes.values()))
        print(json.dumps({"ready": True}), file=out, flush=True)
        async for line in _lines():
            msg = json.loads(line)
            lane = lanes[msg["lane"]]
            took = await lane.once(msg["size"], msg["i"])
            print(json.dumps({"took": took, "recv_s": getattr(lane, "last_recv_s", None)}), file=out, flush=True)
    finally:
        await asyncio.gather(*(lane.close() for lane in lanes.values()), return_exceptions=True)


async def _lines():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield line


async def child_backend(kind: str) -> None:
    receiver = make_receiver(kind, "bench", **({"tcp": True} if kind == "local" else {}))
    await receiver.start()
    print(json.dumps({"address": receiver.address}), flush=True)
    async for line in _lines():
        descs = [TensorDescriptor.model_validate(d) for d in json.loads(line)]
        t0 = time.perf_counter()
        got = await receiver.recv(descs, timeout=120)
        took = time.perf_counter() - t0
        del got  # the engine would keep it; dropping it gives the blocks back
        print(json.dumps({"recv_s": took}), flush=True)
    await receiver.close()


async def child_dataplane(lib: str, size: int) -> None:
    from transport.dataplane import (  # optional packages: imported when used
        NixlTarget,
        UcxEcho,
    )

    if lib == "nixl":
        target, done = NixlTarget(size), asyncio.Event()
        print(json.dumps({"address": target.address()}), flush=True)
        serving = asyncio.ensure_future(target.serve(done))
        async for _ in _lines():
            pass
        done.set()
        await serving
        return
    echo = UcxEcho(size)
    print(json.dumps({"address": echo.ucx.address}), flush=True)
    lines = _lines()
    echo.start((await anext(lines)).decode().strip())
    print(json.dumps({"ready": True}), flush=True)
    async for _ in lines:
        pass
    echo.ucx.close()


def child_shm(name: str) -> None:
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # the parent owns it; 3.11 would unlink it at our exit
    while os.read(0, 1):
        os.write(1, b"k")  # the bytes are in the segment: a reader would use them in place
    shm.close()


def child_rawtcp() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(1 << 27))
    while _recv_exactly(conn, buf[:8]):
        size = int.from_bytes(buf[:8], "little")
        if not _recv_exactly(conn, buf[:size]):
            return
        conn.sendall(b"k")


def _recv_exactly(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            return False
        got += n
    return True


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "host":
        asyncio.run(child_host(args[0]))
    elif what == "backend":
        asyncio.run(child_backend(args[0]))
    elif what == "dataplane":
        asyncio.run(child_dataplane(args[0], int(args[1])))
    elif what == "shm":
        child_shm(args[0])
    else:
        child_rawtcp()
