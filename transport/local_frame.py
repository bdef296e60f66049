"""The wire framing of the local backend, shared by its sender and receiver (transport/local.py).

It lives apart so the byte layout and the socket plumbing can be read in one place, and so sender and
receiver logic stays about connections and claims, not struct formats. One frame carries one send():
magic+version, u32 header length, a JSON list of TensorDescriptors, then the raw payloads in descriptor
order; the reply is one status byte, a u32 length and an error text.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct

from pydantic import TypeAdapter

from transport.base import TransportError
from transport.wire import TensorDescriptor

MAGIC = b"TSRV"
VERSION = 1
PREFIX = struct.Struct("!4sBI")  # magic, version, header length
REPLY = struct.Struct("!BI")  # status, error text length
OK, REJECTED, FATAL = 0, 1, 2  # FATAL: the receiver closes the connection after replying
MAX_REPLY_TEXT = 4096
CHUNK = 4 << 20
"""Payloads move in slices of this size: Python 3.11's transport copies unsent bytes into its buffer, so
slicing bounds that copy; the receiver's stream buffer likewise holds at most two slices, never a frame."""
DESCS = TypeAdapter(list[TensorDescriptor])
"""The frame header: parse with DESCS.validate_json, which raises pydantic's ValidationError."""


def pack_head(descs: list[TensorDescriptor]) -> bytes:
    """Prefix and header of a frame; the payloads follow it in descriptor order."""
    header = DESCS.dump_json(descs)
    return PREFIX.pack(MAGIC, VERSION, len(header)) + header


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
