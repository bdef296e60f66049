"""The coordinator's end of the direct reply links (coordinator/protocol/reply_wire.py): LLM workers connect,
say hello, and write their token events here instead of to the reply stream; each frame's events go to their
flights exactly as the reply stream's do (replies.py), and the frame is acked once routed.

A link that breaks the protocol (a bad hello, a frame out of order, too large or not parsing) is closed: its
worker writes what was not acked to the reply stream, so nothing is lost by closing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket

from pydantic import ValidationError

from coordinator.flights import FlightBook
from coordinator.protocol.reply_wire import (
    ACK, HEADER, HELLO_MAGIC, HELLO_TIMEOUT_S, MAX_FRAME_BYTES, MAX_HELLO_BYTES, NONCE_BYTES, Hello, check_hello,
    frame, join_address)
from coordinator.protocol.streams import parse_event_list

log = logging.getLogger(__name__)
MAX_LINKS = 4096
"""Connections served at once (one per LLM worker process); more are closed at once."""


class LinkBroken(Exception):
    """The peer broke the protocol; the link is closed (its worker falls back to the reply stream)."""


class ReplyListener:
    def __init__(self, book: FlightBook, reply_key: str, secret: bytes | None, on_frame=lambda path: None):
        self.book = book
        self.reply_key = reply_key
        self.secret = secret
        self.on_frame = on_frame
        """Called with "direct" per frame routed (the coordinator's tierserve_reply_frames counter)."""
        self.address = ""
        """host:port workers reach this listener at (the job's reply_addr); empty until started."""
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
        task = asyncio.current_task()
        if len(self._links) >= MAX_LINKS:
            writer.close()
            return
        self._links.add(task)
        peer = writer.get_extra_info("peername")
        hello: Hello | None = None
        try:
            hello = await self._greet(reader, writer)
            if hello is not None:
                log.info("reply link up", extra={"worker": hello.worker_id, "peer": str(peer)})
                await self._relay(reader, writer, hello)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker went away (it stopped, or it falls back to the stream)
        except LinkBroken as e:
            log.error("closing a reply link that broke the protocol",
                      extra={"worker": hello.worker_id if hello else "", "peer": str(peer), "error": str(e)})
        finally:
            self._links.discard(task)
            writer.close()
            if hello is not None:
                log.info("reply link down", extra={"worker": hello.worker_id})

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
        refusal = check_hello(hello, self.secret, nonce, self.reply_key)
        if refusal is not None:
            log.warning("refused a reply link", extra={"worker": hello.worker_id, "reason": refusal})
            writer.write(frame(0, refusal.encode()))
            await writer.drain()
            return None
        writer.write(frame(0, b""))
        return hello

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: Hello) -> None:
        last = 0
        while True:
            size, seq = HEADER.unpack(await reader.readexactly(HEADER.size))
            if size > MAX_FRAME_BYTES:
                raise LinkBroken(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
            if seq != last + 1:
                raise LinkBroken(f"frame {seq} after {last}")
            body = await reader.readexactly(size)
            try:
                events = parse_event_list(body)
            except Exception as e:  # the worker writes this frame to the stream, where it is dropped and logged
                raise LinkBroken(f"frame {seq} does not parse: {e}") from None
            for ev in events:
                try:
                    self.book.route(ev)
                except Exception as e:  # one event must not stop the link (as on the stream, replies.py)
                    log.error("dropping a reply event that could not be routed",
                              extra={"worker": hello.worker_id, "request_id": ev.request_id, "error": str(e)})
            last = seq
            self.on_frame("direct")
            writer.write(ACK.pack(seq))


WILDCARDS = ("0.0.0.0", "::", "")


async def open_listener(config, book: FlightBook, reply_key: str, secret: bytes | None,
                        on_frame=lambda path: None) -> ReplyListener | None:
    """The coordinator's listener as `config` asks (direct_replies, reply_host, reply_port), or None with the
    reason logged: off, or no cluster secret for a listener other hosts can reach."""
    from coordinator.auth import is_loopback

    if not config.direct_replies:
        return None
    advertise = config.reply_host or (socket.getfqdn() if config.host in WILDCARDS else config.host)
    if secret is None and not (is_loopback(config.host) and is_loopback(advertise)):
        log.warning("no direct reply links: listening off loopback needs the cluster secret (set "
                    "TIERSERVE_CLUSTER_SECRET for the coordinator and every worker); tokens go through Redis alone")
        return None
    listener = ReplyListener(book, reply_key, secret, on_frame)
    await listener.start(config.host, config.reply_port, advertise)
    log.info("reply links listening", extra={"address": listener.address, "authenticated": secret is not None})
    return listener
