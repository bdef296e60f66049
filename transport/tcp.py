"""The tcp backend: the portable fallback that works between any two hosts, and the reference the fast
backends are measured against.

Same frame as the local backend (transport/local_frame.py), but the receiver reads each payload with
`sock_recv_into` straight into a tensor it allocated from the descriptor, instead of growing a buffer
from a StreamReader (four times faster on the same loopback). It listens on any address, not just
loopback: there is no authentication, so bind it to a cluster-internal interface only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field

import torch

from transport.admission import Limits
from transport.auth import Signer
from transport.base import EmbeddingSender, TransportError
from transport.checksum import off_loop
from transport.inbox import Inbox, InboxReceiver
from transport.local_frame import (
    FATAL,
    OK,
    PREFIX,
    REPLY,
    FrameReject,
    file_frame,
    header_length,
    pack_head,
    pack_reply,
    parse_address,
    parse_header,
)
from transport.pool import RecvBuffers
from transport.sockio import recv_bytes, recv_exactly_into, tune
from transport.wire import TensorDescriptor, describe, rebuild

log = logging.getLogger(__name__)

@dataclass
class _Conn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sock: socket.socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


class TcpSender(EmbeddingSender):
    """One persistent connection per peer, one send at a time on it (the per-peer in-flight bound)."""

    def __init__(self, *, timeout: float = 120.0, connect_timeout: float = 5.0, secret: bytes | None = None,
                 signer: Signer | None = None) -> None:
        self.timeout = timeout
        """Seconds one send may take from first byte to the receiver's reply."""
        self.connect_timeout = connect_timeout
        self._signer = signer or (Signer(secret) if secret is not None else None)
        """Stamps each frame with the cluster secret (transport/auth.py); None: unauthenticated."""
        self._conns: dict[str, _Conn] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        described = [await off_loop(t.nbytes, describe, request_id, name, t) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        conn = self._conns.setdefault(peer, _Conn())
        async with conn.lock:
            for attempt in (1, 2):
                reused = conn.sock is not None
                if not reused:
                    await self._connect(peer, conn)
                try:
                    async with asyncio.timeout(self.timeout):
                        status, text = await self._exchange(conn.sock, pack_head(descs, self._signer, peer), described)
                    break
                except ConnectionError as e:
                    conn.close()
                    if reused and attempt == 1:
                        continue  # a pooled connection to a restarted receiver: retry once, fresh
                    raise TransportError(f"connection to {peer} broke while sending {request_id}: {e!r}") from e
                except TimeoutError:
                    conn.close()
                    raise TransportError(f"{peer} did not confirm {request_id} within {self.timeout}s") from None
                except BaseException:
                    conn.close()  # cancelled mid-frame: the stream is out of step
                    raise
            if status != OK:
                conn.close()
        if status != OK:
            raise TransportError(f"{peer} rejected {request_id}: {text}")
        return descs

    async def _connect(self, peer: str, conn: _Conn) -> None:
        kind, where = parse_address(peer)
        if kind != "tcp":
            raise TransportError(f"the tcp transport takes tcp://HOST:PORT addresses, got {peer!r}")
        sock = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET, socket.SOCK_STREAM)
        tune(sock)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.get_running_loop().sock_connect(sock, where)
        except TimeoutError:
            sock.close()
            raise TransportError(f"timed out connecting to {peer}: is the receiving worker alive and reachable?") \
                from None
        except OSError as e:
            sock.close()
            raise TransportError(f"cannot connect to {peer} ({e.strerror or e}): is the receiving worker running, "
                                 "and is the address it published in the registry current?") from e
        conn.sock = sock

    @staticmethod
    async def _exchange(sock: socket.socket, head: bytes,
                        described: list[tuple[TensorDescriptor, memoryview]]) -> tuple[int, str]:
        """Send one frame and read the reply; a receiver that refuses a frame early replies, then hangs up."""
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(sock, head)
            for _, raw in described:
                await loop.sock_sendall(sock, raw)
        except ConnectionError:
            async with asyncio.timeout(1.0):  # the refusal may still be readable
                return await _read_reply(sock)
        return await _read_reply(sock)

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


async def _read_reply(sock: socket.socket) -> tuple[int, str]:
    status, n = REPLY.unpack(await recv_bytes(sock, REPLY.size))
    return status, (await recv_bytes(sock, n)).decode(errors="replace")


class TcpReceiver(InboxReceiver):
    """Accepts frames on a TCP port, reads payloads into tensors it allocated, verifies, then replies."""

    def __init__(self, worker_id: str = "", *, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
                 ttl: float = 60.0, max_payload: int = 4 << 30, max_header: int = 1 << 20,
                 pool_bytes: int = 256 << 20, secret: bytes | None = None, max_unclaimed_bytes: int = 1 << 30,
                 max_request_bytes: int = 512 << 20) -> None:
        if host in ("0.0.0.0", "::") and not advertise:
            raise TransportError(f"listening on {host} needs advertise=<this host's address that senders can reach>")
        self.worker_id = worker_id
        self.host, self.port, self.advertise = host, port, advertise
        self.max_payload = max_payload
        """Largest total payload of one frame in bytes; bigger frames get an error reply."""
        self.max_header = max_header
        self._buffers = RecvBuffers(pool_bytes)
        """Receive memory reused across transfers (fresh pages fault more than the copy costs)."""
        self._inbox = Inbox(f"tcp://{host}:{port}", Limits(ttl, max_unclaimed_bytes, max_request_bytes), secret)
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._socks: set[socket.socket] = set()

    @property
    def address(self) -> str:
        host = self.advertise or self.host
        return f"tcp://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise TransportError(
                f"cannot listen on {self.host}:{self.port} ({e.strerror}); pick another host/port") from e
        sock.listen(64)
        sock.setblocking(False)
        self._listener, self.port = sock, sock.getsockname()[1]
        self._inbox.bind(self.address)
        self._spawn(self._accept())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for sock in list(self._socks):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the handler reads EOF and ends
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._inbox.close()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while self._listener is not None:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError:
                return  # closed
            tune(sock)
            self._spawn(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._socks.add(sock)
        try:
            while True:
                prefix = await loop.sock_recv(sock, PREFIX.size)
                if not prefix:
                    return
                if len(prefix) < PREFIX.size:
                    prefix += await recv_bytes(sock, PREFIX.size - len(prefix))
                status, text = OK, ""
                try:
                    await self._take_frame(sock, prefix)
                except FrameReject as e:
                    status, text = e.status, str(e)
                    log.warning("rejected a frame at %s: %s", self.address, text)
                await loop.sock_sendall(sock, pack_reply(status, text))
                if status == FATAL:
                    return
        except (ConnectionError, OSError):
            pass  # the sender went away mid-frame; it sees the error on its side
        finally:
            self._socks.discard(sock)
            sock.close()

    async def _take_frame(self, sock: socket.socket, prefix: bytes) -> None:
        hlen = header_length(prefix, self.max_header)
        head = parse_header(await recv_bytes(sock, hlen), self.max_payload, self.address)

        async def read(d: TensorDescriptor) -> torch.Tensor:
            view = self._buffers.take(d.nbytes)  # the memory the engine gets: no copy after this
            await recv_exactly_into(sock, view)
            return await off_loop(d.nbytes, rebuild, d, view)

        await file_frame(self._inbox, head, read)
