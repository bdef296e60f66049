"""The reading end of direct links (link_wire.py): writers connect, say hello, and write the entries they would
append to a stream; each frame's body goes to `take` (which raises to reject it) and is acked once taken.

A link that breaks the protocol (a bad hello, a frame out of order, too large, or one `take` rejects) is closed:
its writer appends what was not acked to the stream instead, so nothing is lost by closing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable

from pydantic import ValidationError

from coordinator.protocol.addresses import join_address
from coordinator.protocol.link_wire import (
    ACK, HEADER, HELLO_MAGIC, HELLO_TIMEOUT_S, MAX_FRAME_BYTES, MAX_HELLO_BYTES, NONCE_BYTES, Hello, check_hello, frame)

log = logging.getLogger(__name__)
MAX_LINKS = 4096
"""Connections served at once (one per writing process); more are closed at once."""


class LinkBroken(Exception):
    """The peer broke the protocol; the link is closed (its writer falls back to the stream)."""


class LinkListener:
    def __init__(self, stream: str, secret: bytes | None, take: Callable[[bytes], None]):
        self.stream = stream
        self.secret = secret
        self.take = take
        """Called with each frame's body, in order; an exception rejects the frame and closes the link."""
        self.address = ""
        """host:port writers reach this listener at; empty until started."""
        self._server: asyncio.base_events.Server | None = None
        self._links: set[asyncio.Task] = set()

    async def start(self, host: str, port: int = 0, advertise: str | None = None) -> str:
        self._server = await asyncio.start_server(self._serve, host, port, limit=1 << 16)
        bound = self._server.sockets[0].getsockname()[1]
        self.address = join_address(advertise or host, bound)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        if self._links:
            await asyncio.wait(self._links, timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._links) >= MAX_LINKS:
            writer.close()
            return
        task = asyncio.current_task()
        self._links.add(task)
        peer = writer.get_extra_info("peername")
        hello: Hello | None = None
        try:
            hello = await self._greet(reader, writer)
            if hello is not None:
                log.info("link up", extra={"stream": self.stream, "writer": hello.writer, "peer": str(peer)})
                await self._relay(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the writer went away (it stopped, or it falls back to the stream)
        except LinkBroken as e:
            log.error("closing a link that broke the protocol", extra={
                "stream": self.stream, "writer": hello.writer if hello else "", "peer": str(peer), "error": str(e)})
        finally:
            self._links.discard(task)
            writer.close()
            if hello is not None:
                log.info("link down", extra={"stream": self.stream, "writer": hello.writer})

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Hello | None:
        nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(HELLO_MAGIC + nonce)
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                size, seq = HEADER.unpack(await reader.readexactly(HEADER.size))
                if size > MAX_HELLO_BYTES or seq != 0:
                    raise LinkBroken(f"a hello of {size} bytes with seq {seq} (at most {MAX_HELLO_BYTES}, seq 0)")
                hello = Hello.model_validate_json(await reader.readexactly(size))
        except TimeoutError:
            raise LinkBroken(f"no hello within {HELLO_TIMEOUT_S:.0f} s") from None
        except ValidationError as e:
            raise LinkBroken(f"a hello that does not parse: {e.errors()[0].get('msg', e)}") from None
        refusal = check_hello(hello, self.secret, nonce, self.stream)
        if refusal is not None:
            log.warning("refused a link", extra={"stream": self.stream, "writer": hello.writer, "reason": refusal})
            writer.write(frame(0, refusal.encode()))
            await writer.drain()
            return None
        writer.write(frame(0, b""))
        return hello

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        last = 0
        while True:
            size, seq = HEADER.unpack(await reader.readexactly(HEADER.size))
            if size > MAX_FRAME_BYTES:
                raise LinkBroken(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
            if seq != last + 1:
                raise LinkBroken(f"frame {seq} after {last}")
            body = await reader.readexactly(size)
            try:
                self.take(body)
            except Exception as e:  # the writer appends this frame to the stream, where its reader logs and drops it
                raise LinkBroken(f"frame {seq} rejected: {e}") from None
            last = seq
            writer.write(ACK.pack(seq))
