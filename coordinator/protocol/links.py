"""The writing end of direct links (link_wire.py): each entry goes over its stream's link when one is up, else is
appended to the stream, as before.

A link is opened in the background the first time a stream's entries are written with an address (those are
appended meanwhile), so opening one never delays an entry. Frames the reader has not acked are kept; when the link
breaks (the reader closed it or went away) or stalls (no ack within `ack_wait_s`, or more than `max_unacked_bytes`
waiting), they are appended to the stream, in order and before anything that comes after them, and a new link is
tried `retry_s` later. A reader that refuses the link (another cluster secret, another process on that port) is
asked again only after `refused_retry_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from coordinator.protocol.addresses import split_address
from coordinator.protocol.link_wire import ACK, HEADER, HELLO_MAGIC, MAX_HELLO_BYTES, NONCE_BYTES, Hello, frame, hello_mac

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 2.0
ACK_WAIT_S = 2.0
RETRY_S = 1.0
REFUSED_RETRY_S = 30.0
MAX_UNACKED_BYTES = 16 << 20
MAX_SLOTS = 256


class _Link:
    """One open link: frames out, acks in; `down` hands what was not acked to `Links.went_down` exactly once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, links: "Links",
                 key: str, address: str):
        self.reader, self.writer, self.links = reader, writer, links
        self.key, self.address = key, address
        self.seq = 0
        self.unacked: deque[tuple[int, bytes, float]] = deque()
        """(seq, body, time.monotonic() when written) of every frame not acked yet, oldest first."""
        self.unacked_bytes = 0
        self.up = True
        self.acks = asyncio.create_task(self._read_acks())

    def send(self, body: bytes) -> bool:
        """Write one frame; False (nothing written) when the link is down or stalled."""
        if not self.up:
            return False
        now = time.monotonic()
        if self.writer.is_closing():
            self.down("the connection closed")
            return False
        if self.unacked and now - self.unacked[0][2] > self.links.ack_wait_s:
            self.down(f"no ack within {self.links.ack_wait_s:.1f} s")
            return False
        if self.unacked_bytes + len(body) > self.links.max_unacked_bytes:
            self.down(f"more than {self.links.max_unacked_bytes} bytes not acked")
            return False
        self.seq += 1
        self.writer.write(frame(self.seq, body))
        self.unacked.append((self.seq, body, now))
        self.unacked_bytes += len(body)
        return True

    async def _read_acks(self) -> None:
        try:
            while self.up:
                try:
                    async with asyncio.timeout(self.links.ack_wait_s):
                        (acked,) = ACK.unpack(await self.reader.readexactly(ACK.size))
                except TimeoutError:
                    if self.unacked and time.monotonic() - self.unacked[0][2] > self.links.ack_wait_s:
                        self.down(f"no ack within {self.links.ack_wait_s:.1f} s")
                    continue
                while self.unacked and self.unacked[0][0] <= acked:
                    self.unacked_bytes -= len(self.unacked.popleft()[1])
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            self.down(f"the reader closed it ({type(e).__name__})")

    def down(self, reason: str) -> None:
        if not self.up:
            return
        self.up = False
        self.writer.transport.abort()
        if self.acks is not asyncio.current_task():
            self.acks.cancel()
        bodies = [body for _, body, _ in self.unacked]
        self.unacked.clear()
        self.unacked_bytes = 0
        self.links.went_down(self, reason, bodies)


@dataclass
class _Slot:
    """What the writer knows of one stream's link: the link, or when to try again."""

    link: _Link | None = None
    connecting: asyncio.Task | None = None
    retry_at: float = 0.0
    refusal: str = ""
    """Why the reader refused the last hello, if it did."""


Append = Callable[[list[tuple[str, bytes]]], Awaitable[None]]
"""Appends (stream key, body) entries to their streams in Redis, in order, in one round trip."""


class Links:
    def __init__(self, append: Append, writer: str, secret: bytes | None, *, ack_wait_s: float = ACK_WAIT_S,
                 retry_s: float = RETRY_S, refused_retry_s: float = REFUSED_RETRY_S,
                 max_unacked_bytes: int = MAX_UNACKED_BYTES):
        self.append, self.writer, self.secret = append, writer, secret
        self.ack_wait_s, self.retry_s, self.refused_retry_s = ack_wait_s, retry_s, refused_retry_s
        self.max_unacked_bytes = max_unacked_bytes
        self.slots: dict[tuple[str, str], _Slot] = {}
        self._resends: list[asyncio.Task] = []
        self.counts = {"direct": 0, "stream": 0, "resent": 0}
        """Frames written each way since start, and frames appended to the stream after a link went down."""

    async def publish(self, entries: list[tuple[str, str | None, bytes]]) -> int:
        """(stream key, its link's address or None, body) in order: each body goes over its stream's link when one
        is up, the rest to the streams in one round trip. Returns how many went over a link."""
        rest: list[tuple[str, bytes]] = []
        for key, address, body in entries:
            link = self._link(key, address) if address else None
            if link is not None and link.send(body):
                self.counts["direct"] += 1
            else:
                rest.append((key, body))
        if rest:
            await self._settle()  # frames of a link that went down come before these
            await self.append(rest)
            self.counts["stream"] += len(rest)
        return len(entries) - len(rest)

    def _link(self, key: str, address: str) -> _Link | None:
        slot = self.slots.get((key, address))
        if slot is None:
            if len(self.slots) >= MAX_SLOTS:  # readers come and go (each process has its own stream)
                for k in [k for k, s in self.slots.items() if s.link is None and s.connecting is None]:
                    del self.slots[k]
            slot = self.slots[(key, address)] = _Slot()
        if slot.link is not None and slot.link.up:
            return slot.link
        if slot.connecting is None and time.monotonic() >= slot.retry_at:
            slot.connecting = asyncio.create_task(self._connect(slot, key, address))
        return None

    async def _connect(self, slot: _Slot, key: str, address: str) -> None:
        writer = None
        try:
            host, port = split_address(address)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(host, port)
                greeting = await reader.readexactly(len(HELLO_MAGIC) + NONCE_BYTES)
                if not greeting.startswith(HELLO_MAGIC):
                    raise ConnectionError(f"{address} does not speak the link protocol {HELLO_MAGIC!r}")
                nonce = greeting[len(HELLO_MAGIC):]
                mac = hello_mac(self.secret, nonce, self.writer, key) if self.secret else ""
                writer.write(frame(0, Hello(writer=self.writer, stream=key, mac=mac).model_dump_json().encode()))
                size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
                if size > MAX_HELLO_BYTES:
                    raise ConnectionError(f"{address} answered the hello with {size} bytes")
                refusal = (await reader.readexactly(size)).decode(errors="replace")
            if refusal:
                slot.refusal = refusal
                log.warning("link refused; its entries go through Redis",
                            extra={"address": address, "stream": key, "reason": refusal})
                slot.retry_at = time.monotonic() + self.refused_retry_s
                writer.close()
                return
            slot.link = _Link(reader, writer, self, key, address)
            log.info("link up", extra={"address": address, "stream": key})
        except (OSError, ConnectionError, TimeoutError, ValueError, asyncio.IncompleteReadError) as e:
            log.warning("no link; its entries go through Redis",
                        extra={"address": address, "stream": key, "error": f"{type(e).__name__}: {e}"})
            slot.retry_at = time.monotonic() + self.retry_s
            if writer is not None:
                writer.close()
        finally:
            slot.connecting = None

    def went_down(self, link: _Link, reason: str, bodies: list[bytes]) -> None:
        """A link's end: its unacked frames to the stream (publish waits for them), a new link after retry_s."""
        slot = self.slots.get((link.key, link.address))
        if slot is not None and slot.link is link:
            slot.link = None
            slot.retry_at = time.monotonic() + self.retry_s
        log.warning("link down; its unacked entries go through Redis",
                    extra={"address": link.address, "stream": link.key, "reason": reason, "frames": len(bodies)})
        if bodies:
            self.counts["resent"] += len(bodies)
            self._resends.append(asyncio.create_task(self.append([(link.key, b) for b in bodies])))

    async def _settle(self) -> None:
        while self._resends:
            task = self._resends.pop(0)
            try:
                await task
            except Exception as e:  # Redis failing past its retries: as a lost stream write would be
                log.error("could not append a downed link's entries to Redis", extra={"error": str(e)})

    async def close(self) -> None:
        """Every link down (what is not acked goes to the streams), and those appends done."""
        for slot in self.slots.values():
            if slot.connecting is not None:
                slot.connecting.cancel()
            if slot.link is not None:
                slot.link.down("the worker is stopping")
        await self._settle()
