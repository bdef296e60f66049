"""Non-blocking socket plumbing for the tcp backend: buffer sizes, and reading straight into memory.

`sock_recv_into` into memory the receiver owns is what makes the tcp backend four times faster than
reading through a StreamReader (3.7 vs 0.9 GB/s on loopback, as measured for issue 3): no intermediate
buffer, no growing copy.
"""

from __future__ import annotations

import asyncio
import socket

SOCK_BUF = 4 << 20
"""Kernel socket buffer size: large enough that a 4.5 MB embedding needs few wake-ups."""


def tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)


async def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from the socket; a peer that hangs up first is a ConnectionError."""
    loop = asyncio.get_running_loop()
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {len(view)} bytes")
        got += n


async def recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await recv_exactly_into(sock, memoryview(buf))
    return bytes(buf)
