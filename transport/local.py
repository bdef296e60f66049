"""The local backend: tensors over a Unix socket or loopback TCP, between processes on one host.

It is the sibling of the UCX/NIXL backends for tests and single-host setups. One frame carries one
send() (the byte layout is in transport/local_frame.py). The receiver verifies every tensor before it
replies, so send() returning means the bytes arrived intact.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import torch
from pydantic import ValidationError

from transport.base import EmbeddingReceiver, EmbeddingSender, TransportError
from transport.local_frame import (
    CHUNK,
    DESCS,
    FATAL,
    MAGIC,
    OK,
    PREFIX,
    REJECTED,
    VERSION,
    open_connection,
    pack_head,
    pack_reply,
    parse_address,
    read_exactly_into,
    read_reply,
    remove_stale_socket,
    unlink_own_socket,
)
from transport.wire import TensorDescriptor, WireError, describe, rebuild

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

    def __init__(self, *, timeout: float = 120.0, connect_timeout: float = 5.0) -> None:
        self.timeout = timeout
        """Seconds one send may take from first byte to the receiver's reply."""
        self.connect_timeout = connect_timeout
        self._conns: dict[str, _Conn] = {}

    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        described = [await _off_loop(t.nbytes, describe, request_id, name, t) for name, t in tensors.items()]
        descs = [d for d, _ in described]
        head = pack_head(descs)
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


class _Reject(Exception):
    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.status = status


class LocalReceiver(EmbeddingReceiver):
    """Accepts frames, verifies them, and holds the tensors until recv() claims them or the TTL ends."""

    def __init__(
        self, address: str, *, ttl: float = 300.0, max_payload: int = 4 << 30, max_header: int = 1 << 20
    ) -> None:
        self._kind, self._where = parse_address(address)
        if self._kind == "tcp" and self._where[0] not in ("127.0.0.1", "::1"):
            raise TransportError(f"{address}: the local backend listens on 127.0.0.1 or ::1 only (no authentication)")
        self._address = address
        self.ttl = ttl
        """Seconds after its last arrival that an unclaimed request is dropped, so memory cannot leak."""
        self.max_payload = max_payload
        """Largest total payload of one frame in bytes; bigger frames get an error reply."""
        self.max_header = max_header
        self._server: asyncio.Server | None = None
        self._inode: int | None = None
        self._handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._arrived: dict[str, dict[str, tuple[TensorDescriptor, torch.Tensor]]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._arrival = asyncio.Condition()
        """Notified on every arrival; each waiting recv() rechecks its own request."""
        self._closed = False

    @property
    def address(self) -> str:
        return self._address

    @property
    def pending_bytes(self) -> int:
        """Bytes arrived but not yet claimed (a gauge for metrics and tests)."""
        return sum(d.nbytes for per in self._arrived.values() for d, _ in per.values())

    async def start(self) -> None:
        if self._kind == "tcp":
            self._server = await asyncio.start_server(self._serve, *self._where, limit=CHUNK)
            host = self._where[0]
            self._address = f"tcp://{f'[{host}]' if ':' in host else host}:{self._server.sockets[0].getsockname()[1]}"
            return
        path = self._where
        if len(os.fsencode(path)) > 107:
            raise TransportError(f"unix socket path {path!r} is longer than 107 bytes; choose a shorter runtime dir")
        remove_stale_socket(path)
        self._server = await asyncio.start_unix_server(self._serve, path, limit=CHUNK)
        self._inode = os.stat(path).st_ino

    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        rid = descriptors[0].request_id if descriptors else ""
        if any(d.request_id != rid for d in descriptors) or len({d.name for d in descriptors}) != len(descriptors):
            raise ValueError(f"recv() takes distinct tensors of one request, got {_names(descriptors)}")
        try:
            async with asyncio.timeout(timeout), self._arrival:
                await self._arrival.wait_for(lambda: self._has(rid, descriptors))
        except TimeoutError:
            raise TransportError(
                f"{rid}: tensors {[d.name for d in descriptors]} did not all arrive at {self.address} within "
                f"{timeout}s (arrived: {sorted(self._arrived.get(rid, {}))}); was the send made to this address, "
                f"and claimed within ttl={self.ttl}s?"
            ) from None
        per = self._arrived.get(rid, {})
        for d in descriptors:
            if per[d.name][0] != d:
                raise TransportError(f"{rid}/{d.name}: asked for {d!r} but received {per[d.name][0]!r}")
        out = {d.name: per.pop(d.name)[1] for d in descriptors}
        if not per:
            self._drop(rid)
        return out

    async def discard(self, request_id: str) -> None:
        self._drop(request_id)

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        for writer in self._handlers.values():
            writer.close()  # the handler then reads EOF and ends; cancelling it would log a spurious error
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        for rid in list(self._arrived):
            self._drop(rid)
        async with self._arrival:
            self._arrival.notify_all()  # waiting recv() calls fail now rather than at their timeout
        if self._inode is not None:
            unlink_own_socket(self._where, self._inode)
            self._inode = None
        self._server = None

    def _has(self, rid: str, descriptors: list[TensorDescriptor]) -> bool:
        if self._closed:
            raise TransportError(f"receiver {self.address} closed while waiting for {rid}")
        per = self._arrived.get(rid, {})
        return all(d.name in per for d in descriptors)

    def _drop(self, rid: str) -> None:
        self._arrived.pop(rid, None)
        handle = self._expiry.pop(rid, None)
        if handle is not None:
            handle.cancel()

    def _expire(self, rid: str) -> None:
        log.warning("dropping unclaimed tensors %s of %s after %ss", sorted(self._arrived.get(rid, {})), rid, self.ttl)
        self._drop(rid)

    async def _store(self, rid: str, tensors: dict[str, tuple[TensorDescriptor, torch.Tensor]]) -> None:
        self._arrived.setdefault(rid, {}).update(tensors)
        old = self._expiry.pop(rid, None)
        if old is not None:
            old.cancel()
        self._expiry[rid] = asyncio.get_running_loop().call_later(self.ttl, self._expire, rid)
        async with self._arrival:
            self._arrival.notify_all()

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
                except _Reject as e:
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
        magic, version, hlen = PREFIX.unpack(prefix)
        if magic != MAGIC or version != VERSION:
            raise _Reject(f"not a tierserve frame: magic {magic!r} v{version}, expected {MAGIC!r} v{VERSION}", FATAL)
        if hlen > self.max_header:
            raise _Reject(f"header of {hlen} bytes exceeds max_header={self.max_header}", FATAL)
        try:
            descs = DESCS.validate_json(await reader.readexactly(hlen))
        except ValidationError as e:
            raise _Reject(f"invalid header: {e.error_count()} errors, first: {e.errors()[0]['msg']}", FATAL) from None
        if len({d.request_id for d in descs}) > 1 or len({d.name for d in descs}) != len(descs):
            raise _Reject(f"a frame carries distinct tensors of one request, got {_names(descs)}", FATAL)
        total = sum(d.nbytes for d in descs)
        if total > self.max_payload:
            raise _Reject(f"payload of {total} bytes exceeds max_payload={self.max_payload} of {self.address}", FATAL)
        tensors, errors = {}, []
        for d in descs:
            raw = await read_exactly_into(reader, d.nbytes)
            try:
                tensors[d.name] = (d, await _off_loop(d.nbytes, rebuild, d, raw))
            # RuntimeError: torch overflows on a zero-byte shape with huge dimensions, e.g. (0, 2**62, 2**62).
            except (WireError, RuntimeError, ValueError) as e:  # keep reading: the stream stays in step
                errors.append(str(e))
        if errors:
            raise _Reject("; ".join(errors), REJECTED)
        if descs:
            await self._store(descs[0].request_id, tensors)


async def _off_loop(nbytes: int, fn, *args):
    return await asyncio.to_thread(fn, *args) if nbytes >= OFF_LOOP else fn(*args)


def _names(descs: list[TensorDescriptor]) -> list[tuple[str, str]]:
    return [(d.request_id, d.name) for d in descs]
