"""The wire framing of the local backend, shared by its sender and receiver (transport/local.py).

It lives apart so the byte layout and the socket plumbing can be read in one place, and so sender and
receiver logic stays about connections and claims, not struct formats. One frame carries one send():
magic+version, u32 header length, a JSON header (the TensorDescriptors and, when the cluster has a
secret, their authentication Stamp), then the raw payloads in descriptor order; the reply is one status
byte, a u32 length and an error text. The receiver checks the header before it reads any payload byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from transport.admission import Refused
from transport.auth import Signer, Stamp, descs_body
from transport.base import TransportError
from transport.wire import TensorDescriptor, WireError

if TYPE_CHECKING:
    import torch

    from transport.inbox import Inbox

MAGIC = b"TSRV"
VERSION = 2
"""2: the header is an object with the stamp (1 was a bare list of descriptors)."""
PREFIX = struct.Struct("!4sBI")  # magic, version, header length
REPLY = struct.Struct("!BI")  # status, error text length
OK, REJECTED, FATAL = 0, 1, 2  # FATAL: the receiver closes the connection after replying
MAX_REPLY_TEXT = 4096
CHUNK = 4 << 20
"""Payloads move in slices of this size: Python 3.11's transport copies unsent bytes into its buffer, so
slicing bounds that copy; the receiver's stream buffer likewise holds at most two slices, never a frame."""


class Header(BaseModel):
    """What a frame announces before its payloads."""

    model_config = ConfigDict(frozen=True)

    descs: list[TensorDescriptor]
    stamp: Stamp | None = None
    """HMAC over the descriptors for the receiver at the address sent to (None without a cluster secret)."""


class FrameReject(Exception):
    """A frame the receiver answers with `status` (FATAL: and hangs up) and this text."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.status = status


def pack_head(descs: list[TensorDescriptor], signer: Signer | None = None, peer: str = "") -> bytes:
    """Prefix and header of a frame for the receiver at `peer`; the payloads follow it in descriptor order."""
    stamp = signer.stamp("send", peer, descs_body(descs)) if signer is not None else None
    header = Header(descs=descs, stamp=stamp).model_dump_json().encode()
    return PREFIX.pack(MAGIC, VERSION, len(header)) + header


def header_length(prefix: bytes, max_header: int) -> int:
    magic, version, hlen = PREFIX.unpack(prefix)
    if magic != MAGIC or version != VERSION:
        raise FrameReject(f"not a tierserve frame: magic {magic!r} v{version}, expected {MAGIC!r} v{VERSION} "
                          "(are both workers running the same tierserve version?)", FATAL)
    if hlen > max_header:
        raise FrameReject(f"header of {hlen} bytes exceeds max_header={max_header}", FATAL)
    return hlen


def parse_header(raw: bytes, max_payload: int, where: str) -> Header:
    """The header of one frame, checked for shape and size (not yet for authenticity: the inbox does that)."""
    try:
        head = Header.model_validate_json(raw)
    except ValidationError as e:
        raise FrameReject(f"invalid header: {e.error_count()} errors, first: {e.errors()[0]['msg']}", FATAL) from None
    descs = head.descs
    if len({d.request_id for d in descs}) > 1 or len({d.name for d in descs}) != len(descs):
        raise FrameReject(f"a frame carries distinct tensors of one request, got "
                          f"{[(d.request_id, d.name) for d in descs]}", FATAL)
    total = sum(d.nbytes for d in descs)
    if total > max_payload:
        raise FrameReject(f"payload of {total} bytes exceeds max_payload={max_payload} of {where}", FATAL)
    return head


async def file_frame(inbox: Inbox, head: Header, read: Callable[[TensorDescriptor], Awaitable[torch.Tensor]]) -> None:
    """Admit a frame (before any payload byte is read: a refusal hangs up), read each payload with `read`,
    and file the tensors; a payload that does not match its descriptor is reported after all were read,
    so the stream stays in step."""
    try:
        ticket = inbox.admit(head.descs, head.stamp)
    except Refused as e:
        raise FrameReject(str(e), FATAL) from None
    tensors, errors = {}, []
    try:
        for d in head.descs:
            try:
                tensors[d.name] = (d, await read(d))
            # RuntimeError: torch overflows on a zero-byte shape with huge dimensions, e.g. (0, 2**62, 2**62).
            except (WireError, RuntimeError, ValueError) as e:
                errors.append(str(e))
    except BaseException:
        inbox.release(ticket)
        raise
    if errors or not head.descs:
        inbox.release(ticket)
    if errors:
        raise FrameReject("; ".join(errors), REJECTED)
    if head.descs:
        inbox.store(ticket, tensors)


def pack_reply(status: int, text: str) -> bytes:
    body = text.encode()[:MAX_REPLY_TEXT]
    return REPLY.pack(status, len(body)) + body


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """("unix", path) or ("tcp", (host, port)); anything else is a TransportError."""
    scheme, sep, rest = address.partition("://")
    if sep and scheme == "unix" and rest:
        return "unix", rest
    if sep and scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", (host.strip("[]"), int(port))
    raise TransportError(f"unknown address {address!r}: the local backend takes unix:///path/to.sock or tcp://127.0.0.1:PORT")


async def open_connection(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    kind, where = parse_address(address)
    if kind == "unix":
        return await asyncio.open_unix_connection(where)
    return await asyncio.open_connection(*where)


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, str]:
    status, n = REPLY.unpack(await reader.readexactly(REPLY.size))
    return status, (await reader.readexactly(n)).decode(errors="replace")


async def read_exactly_into(reader: asyncio.StreamReader, n: int) -> bytearray:
    """Read n bytes into a bytearray, which rebuild() views as a tensor without a copy. It grows as bytes
    arrive (realloc moves pages, not bytes) rather than being zero-filled up front, which for a large
    tensor would stall the event loop for as long as the copy itself."""
    buf = bytearray()
    while len(buf) < n:
        chunk = await reader.read(min(n - len(buf), CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", n)
        buf += chunk
    return buf


def remove_stale_socket(path: str) -> None:
    """Unlink a socket file left by a dead receiver, but never steal one that a live receiver serves."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise TransportError(f"{path} exists and is not a socket; refusing to replace it")
    except FileNotFoundError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
            return
    raise TransportError(f"{path} is served by a live receiver; is another worker using the same id?")


def unlink_own_socket(path: str, inode: int) -> None:
    """Unlink the socket file at path if it is still the one we bound (inode), not a successor's."""
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
