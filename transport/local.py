"""The local backend: tensors over a Unix socket or loopback TCP, between processes on one host.

It is the sibling of the UCX/NIXL backends for tests and single-host setups. One frame carries one
send() (the byte layout is in transport/local_frame.py). The receiver admits the frame (authentication
tag, caps: transport/inbox.py) before it reads a payload byte and verifies every tensor before it replies,
so send() returning means the bytes arrived intact; claiming, discarding and expiry are the shared inbox's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import torch

from transport.admission import Limits
from transport.auth import Signer
from transport.base import EmbeddingSender, TransportError
from transport.inbox import Inbox, InboxReceiver
from transport.local_frame import (
    CHUNK,
    FATAL,
    OK,
    PREFIX,
    FrameReject,
    file_frame,
    header_length,
    open_connection,
    pack_head,
    pack_reply,
    parse_address,
    parse_header,
    read_exactly_into,
    read_reply,
    remove_stale_socket,
    unlink_own_socket,
)
from transport.wire import TensorDescriptor, describe, rebuild

log = logging.getLogger(__name__)

OFF_LOOP = 1 << 20
"""Tensors of at least this many bytes are checksummed in a worker thread (zlib releases the GIL), so a
large transfer does not stall the event loop that also drives the worker's engine."""


@dataclass
class _Conn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class LocalSender(EmbeddingSender):
    """Pushes tensors to LocalReceivers over one persistent connection per peer, one send at a time."""

    def __init__(self, *, timeout: float = 120.0, connect_timeout: float = 5.0, secret: bytes | None = None,
                 signer: Signer | None = None) -> None:
        self.timeout = timeout
        """Seconds one send may take from first byte to the receiver's reply."""
        self.connect_timeout = connect_timeout
        self._signer = signer or (Signer(secret) if secret is not None else None)
        """Stamps each frame with the cluster secret (transport/auth.py); None: unauthenticated."""
        self._conns: dict[str, _Conn] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        described = [await _off_loop(t.nbytes, describe, request_id, name, t) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        head = pack_head(descs, self._signer, peer)
        conn = self._conns.get(peer) or self._conns.setdefault(peer, _Conn())
        async with conn.lock:
            for attempt in (1, 2):
                # A pooled connection may have been closed by a restarted receiver: retry it once, fresh.
                reused = conn.writer is not None and not conn.reader.at_eof()
                if not reused:
                    conn.close()
                    await self._connect(peer, conn)
                try:
                    async with asyncio.timeout(self.timeout):
                        status, text = await self._exchange(conn, head, described)
                    break
                except (ConnectionError, asyncio.IncompleteReadError) as e:
                    conn.close()
                    if reused and attempt == 1:
                        continue
                    raise TransportError(f"connection to {peer} broke while sending {request_id}: {e!r}") from e
                except TimeoutError:
                    conn.close()
                    raise TransportError(f"{peer} did not confirm {request_id} within {self.timeout}s") from None
                except BaseException:
                    conn.close()  # cancelled mid-frame: the stream is out of step
                    raise
            if status != OK:
                conn.close()  # the receiver may have hung up, or refused before the frame was complete
        if status != OK:
            raise TransportError(f"{peer} rejected {request_id}: {text}")
        return descs

    async def _connect(self, peer: str, conn: _Conn) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                conn.reader, conn.writer = await open_connection(peer)
        except TimeoutError:
            raise TransportError(f"timed out connecting to {peer}: is the receiving worker alive?") from None
        except OSError as e:
            raise TransportError(
                f"cannot connect to {peer} ({e.strerror or e}): is the receiving worker running, "
                "and is the address it published in the registry current?"
            ) from e

    @staticmethod
    async def _exchange(
        conn: _Conn, head: bytes, described: list[tuple[TensorDescriptor, memoryview]]
    ) -> tuple[int, str]:
        """Stream one frame while already listening for the reply: a receiver that refuses a frame answers
        before it is complete and hangs up, and its reason must not be lost in the connection reset."""
        writer = conn.writer
        reply = asyncio.ensure_future(read_reply(conn.reader))
        try:
            try:
                writer.write(head)
                for _, raw in described:
                    for start in range(0, raw.nbytes, CHUNK):
                        writer.write(raw[start : start + CHUNK])
                        await writer.drain()
                await writer.drain()
            except ConnectionError:
                await asyncio.wait({reply}, timeout=1.0)  # the refusal may still be on its way
                if not reply.done() or reply.exception() is not None:
                    raise
            return await reply
        finally:
            if not reply.cancel() and not reply.cancelled():
                reply.exception()  # retrieved, so an abandoned failure is not logged as unhandled

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


class LocalReceiver(InboxReceiver):
    """Accepts frames, admits and verifies them, and files the tensors in the inbox until recv() claims them."""

    def __init__(self, address: str, *, ttl: float = 60.0, max_payload: int = 4 << 30, max_header: int = 1 << 20,
                 secret: bytes | None = None, max_unclaimed_bytes: int = 1 << 30,
                 max_request_bytes: int = 512 << 20) -> None:
        self._kind, self._where = parse_address(address)
        if self._kind == "tcp" and self._where[0] not in ("127.0.0.1", "::1"):
            raise TransportError(f"{address}: the local backend listens on 127.0.0.1 or ::1 only (one host)")
        self._address = address
        self.max_payload = max_payload
        """Largest total payload of one frame in bytes; bigger frames get an error reply."""
        self.max_header = max_header
        self._inbox = Inbox(address, Limits(ttl, max_unclaimed_bytes, max_request_bytes), secret)
        self._server: asyncio.Server | None = None
        self._inode: int | None = None
        self._handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}

    @property
    def address(self) -> str:
        return self._address

    async def start(self) -> None:
        if self._kind == "tcp":
            self._server = await asyncio.start_server(self._serve, *self._where, limit=CHUNK)
            host = self._where[0]
            self._address = f"tcp://{f'[{host}]' if ':' in host else host}:{self._server.sockets[0].getsockname()[1]}"
            self._inbox.bind(self._address)
            return
        path = self._where
        if len(os.fsencode(path)) > 107:
            raise TransportError(f"unix socket path {path!r} is longer than 107 bytes; choose a shorter runtime dir")
        remove_stale_socket(path)
        self._server = await asyncio.start_unix_server(self._serve, path, limit=CHUNK)
        self._inode = os.stat(path).st_ino
        self._inbox.bind(self._address)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._handlers.values():
            writer.close()  # the handler then reads EOF and ends; cancelling it would log a spurious error
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._inbox.close()  # waiting recv() calls fail now rather than at their timeout
        if self._inode is not None:
            unlink_own_socket(self._where, self._inode)
            self._inode = None
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers[task] = writer
        try:
            while prefix := await reader.read(PREFIX.size):
                if len(prefix) < PREFIX.size:
                    prefix += await reader.readexactly(PREFIX.size - len(prefix))
                status, text = OK, ""
                try:
                    await self._take_frame(reader, prefix)
                except FrameReject as e:
                    status, text = e.status, str(e)
                    log.warning("rejected a frame at %s: %s", self.address, text)
                writer.write(pack_reply(status, text))
                await writer.drain()
                if status == FATAL:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the sender went away mid-frame; it will see the error on its side
        finally:
            writer.close()
            self._handlers.pop(task, None)

    async def _take_frame(self, reader: asyncio.StreamReader, prefix: bytes) -> None:
        hlen = header_length(prefix, self.max_header)
        head = parse_header(await reader.readexactly(hlen), self.max_payload, self.address)

        async def read(d: TensorDescriptor) -> torch.Tensor:
            return await _off_loop(d.nbytes, rebuild, d, await read_exactly_into(reader, d.nbytes))

        await file_frame(self._inbox, head, read)


async def _off_loop(nbytes: int, fn, *args):
    return await asyncio.to_thread(fn, *args) if nbytes >= OFF_LOOP else fn(*args)
