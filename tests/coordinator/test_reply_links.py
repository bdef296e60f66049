"""Reply links (coordinator/protocol/link_wire.py): a worker's Links against the coordinator's real reply
listener and reply-stream reader on real Redis and real TCP sockets. Every token reaches its flight once and
in order whichever way it came: the first writes go to the stream while the link opens, then the link carries
them; a link that breaks or stalls hands what was not acked to the stream; a coordinator refuses a worker without
the cluster's secret, a link meant for another process, and a peer that breaks the protocol."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis.asyncio import Redis

from coordinator.config import CoordinatorConfig
from coordinator.flights import Flight, FlightBook
from coordinator.protocol.messages import SamplingParams, TokenEvent
from coordinator.protocol.process import cancel_and_wait
from coordinator.protocol.link_listener import LinkListener
from coordinator.protocol.link_wire import HEADER, HELLO_MAGIC, NONCE_BYTES, Hello, frame, hello_mac
from coordinator.protocol.links import Links
from coordinator.protocol.streams import event_list, publish_entries
from coordinator.replies import read_replies
from coordinator.reply_listener import open_listener, route_frames

pytestmark = pytest.mark.redis
SECRET = b"s" * 32


def _links(redis: Redis, writer: str, secret: bytes | None, **kw) -> Links:
    return Links(lambda entries: publish_entries(redis, entries), writer, secret, **kw)


def _flight(rid: str = "r1") -> Flight:
    return Flight(request_id=rid, prompt_token_ids=[1], sampling=SamplingParams(max_tokens=8), media=[], received=0.0)


def _body(rid: str, index: int, token: int, finish: str | None = None) -> bytes:
    return event_list([TokenEvent(request_id=rid, index=index, token_ids=[token], finish_reason=finish)])


async def _tokens(flight: Flight, timeout_s: float = 5.0) -> list[int]:
    return [t async for ev in flight.stream(timeout_s) for t in ev.token_ids]


async def _until(cond, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _coordinator(redis_url: str, key_prefix: str, secret: bytes | None = SECRET):
    """A coordinator's two ways in: its listener and its reply-stream reader, over one FlightBook."""
    redis = Redis.from_url(redis_url)
    book, frames = FlightBook(), []
    key = f"{key_prefix}:replies:c1"
    listener = LinkListener(key, secret, route_frames(book, frames.append))
    await listener.start("127.0.0.1")
    reader = asyncio.create_task(read_replies(redis, key, book, on_frame=frames.append))
    try:
        yield book, listener, key, frames, redis
    finally:
        await cancel_and_wait([reader])  # a blocking XREAD may swallow one cancel (process.py)
        await listener.close()
        await redis.aclose()


async def test_tokens_take_the_link_once_it_is_up_and_arrive_once_in_order(redis_url, key_prefix):
    async with _coordinator(redis_url, key_prefix) as (book, listener, key, frames, redis):
        book.add(f := _flight())
        links = _links(redis, "w0", SECRET)
        await links.publish([(key, listener.address, _body("r1", 0, 10))])  # the link opens meanwhile
        await _until(lambda: links.slots[(key, listener.address)].link is not None)
        for i in range(1, 6):
            await links.publish([(key, listener.address, _body("r1", i, 10 + i, "length" if i == 5 else None))])
        assert await _tokens(f) == [10, 11, 12, 13, 14, 15]
        assert links.counts == {"direct": 5, "stream": 1, "resent": 0}
        await _until(lambda: not links.slots[(key, listener.address)].link.unacked)  # every frame acked
        assert frames.count("direct") == 5 and frames.count("stream") == 1
        await links.close()


async def test_a_link_that_stops_acking_hands_its_frames_to_the_stream(redis_url, key_prefix):
    """A coordinator whose link stalls (a peer that greets and then never acks: as a hung process would)."""
    async with _coordinator(redis_url, key_prefix) as (book, listener, key, frames, redis):
        book.add(f := _flight())
        silent = await _silent_peer(key)
        address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
        links = _links(redis, "w0", None, ack_wait_s=0.3, retry_s=60)
        await links.publish([(key, address, _body("r1", 0, 10))])
        await _until(lambda: links.slots[(key, address)].link is not None)
        await links.publish([(key, address, _body("r1", 1, 11))])
        await links.publish([(key, address, _body("r1", 2, 12))])
        assert links.counts["direct"] == 2
        await _until(lambda: links.counts["resent"] == 2)  # no ack within 0.3 s: the stream has them
        await links.publish([(key, address, _body("r1", 3, 13, "stop"))])  # after them, by the stream
        assert await _tokens(f) == [10, 11, 12, 13]
        silent.close()
        await links.close()


async def test_a_link_the_coordinator_closes_hands_its_unacked_frames_to_the_stream_at_once(redis_url, key_prefix):
    async with _coordinator(redis_url, key_prefix) as (book, listener, key, frames, redis):
        book.add(f := _flight())
        silent = await _silent_peer(key, close_after_frames=2)
        address = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
        links = _links(redis, "w0", None, ack_wait_s=30, retry_s=60)
        await links.publish([(key, address, _body("r1", 0, 10))])
        await _until(lambda: links.slots[(key, address)].link is not None)
        await links.publish([(key, address, _body("r1", 1, 11))])
        await links.publish([(key, address, _body("r1", 2, 12, "stop"))])
        assert await _tokens(f, timeout_s=3.0) == [10, 11, 12]  # well before the 30 s ack wait
        assert links.counts["resent"] == 2
        silent.close()
        await links.close()


@pytest.mark.parametrize("worker_secret, hello_key, why", [
    (b"t" * 32, None, "wrong authentication tag"),
    (None, None, "needs the cluster secret"),
    (SECRET, "other", "stands in for stream"),
])
async def test_the_coordinator_refuses_a_link_it_cannot_trust_and_the_tokens_take_the_stream(
        redis_url, key_prefix, worker_secret, hello_key, why):
    async with _coordinator(redis_url, key_prefix) as (book, listener, key, frames, redis):
        book.add(f := _flight())
        links = _links(redis, "w0", worker_secret)
        stream = f"{key_prefix}:replies:{hello_key}" if hello_key else key
        if hello_key:  # the worker believes the listener stands in for another process's stream
            await links.publish([(stream, listener.address, _body("r1", 0, 10))])
            await _until(lambda: links.slots[(stream, listener.address)].refusal)
            assert why in links.slots[(stream, listener.address)].refusal
            return
        await links.publish([(key, listener.address, _body("r1", 0, 10))])
        await _until(lambda: links.slots[(key, listener.address)].refusal)
        assert why in links.slots[(key, listener.address)].refusal
        await links.publish([(key, listener.address, _body("r1", 1, 11, "stop"))])
        assert await _tokens(f) == [10, 11] and links.counts["direct"] == 0 and "direct" not in frames


@pytest.mark.parametrize("case", ["out_of_order", "too_large", "not_json", "bad_hello"])
async def test_a_peer_that_breaks_the_protocol_is_closed_and_routes_nothing(redis_url, key_prefix, case):
    async with _coordinator(redis_url, key_prefix) as (book, listener, key, frames, redis):
        book.add(f := _flight())
        host, port = listener.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        nonce = (await reader.readexactly(len(HELLO_MAGIC) + NONCE_BYTES))[len(HELLO_MAGIC):]
        if case == "bad_hello":
            writer.write(frame(0, b'{"writer": 5}'))
        else:
            hello = Hello(writer="w0", stream=key, mac=hello_mac(SECRET, nonce, "w0", key))
            writer.write(frame(0, hello.model_dump_json().encode()))
            size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
            assert size == 0  # accepted
            if case == "out_of_order":
                writer.write(frame(2, _body("r1", 0, 10)))
            elif case == "too_large":
                writer.write(HEADER.pack(64 << 20, 1))
            else:
                writer.write(frame(1, b"\x80not json"))
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed, nothing acked
        assert f.output_token_ids == [] and "direct" not in frames
        writer.close()


async def test_a_listener_off_loopback_needs_the_cluster_secret():
    off = CoordinatorConfig(host="0.0.0.0", reply_host="10.1.2.3")
    assert await open_listener(off, FlightBook(), "k", None) is None
    assert await open_listener(CoordinatorConfig(direct_links=False), FlightBook(), "k", SECRET) is None
    listener = await open_listener(off, FlightBook(), "k", SECRET)
    try:
        assert listener.address.startswith("10.1.2.3:")
    finally:
        await listener.close()
    local = await open_listener(CoordinatorConfig(), FlightBook(), "k", None)  # one trusted host: no secret needed
    try:
        assert local.address.startswith("127.0.0.1:")
    finally:
        await local.close()


async def _silent_peer(key: str, close_after_frames: int | None = None) -> asyncio.base_events.Server:
    """A real TCP peer that speaks the hello (accepting any worker for `key`), reads frames and never acks them;
    with `close_after_frames` it hangs up after that many."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HELLO_MAGIC + b"n" * NONCE_BYTES)
        size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
        assert Hello.model_validate_json(await reader.readexactly(size)).stream == key
        writer.write(frame(0, b""))
        got = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while close_after_frames is None or got < close_after_frames:
                size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
                await reader.readexactly(size)
                got += 1
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)

