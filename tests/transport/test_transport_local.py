import asyncio
import json
import os
import re
import shutil
import socket
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
import torch

import transport.local as local
from transport.base import TransportError
from transport.local import LocalReceiver, LocalSender
from transport.wire import TensorDescriptor, describe, tensor_bytes

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("recv_child.py")


@pytest.fixture
def sock_dir():
    # short and private: Unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer
    d = tempfile.mkdtemp(prefix="ts-", dir="/tmp")
    yield Path(d)
    leftovers = os.listdir(d)
    shutil.rmtree(d)
    assert not leftovers, f"sockets not cleaned up: {leftovers}"


@pytest.fixture
async def open_receiver(sock_dir):
    """Starts receivers (on a fresh socket unless an address is given) and closes them after the test."""
    started = []

    async def start(address=None, **opts):
        r = LocalReceiver(address or f"unix://{sock_dir}/r{len(started)}.sock", **opts)
        await r.start()
        started.append(r)
        return r

    yield start
    for r in started:
        await r.close()


@pytest.fixture
async def sender():
    s = LocalSender(timeout=10.0, connect_timeout=2.0)
    yield s
    await s.close()


def _count_opens(monkeypatch) -> list[str]:
    opened = []
    real = local.open_connection

    async def counting(address):
        opened.append(address)
        return await real(address)

    monkeypatch.setattr(local, "open_connection", counting)
    return opened


def _frame(descs: list[dict], payload: bytes, magic=b"TSRV", version=2) -> bytes:
    """A frame written by hand, so a change of the wire format shows up here."""
    header = json.dumps({"descs": descs}).encode()
    return struct.pack("!4sBI", magic, version, len(header)) + header + payload


async def _reply(reader) -> tuple[int, str]:
    status, n = struct.unpack("!BI", await reader.readexactly(5))
    return status, (await reader.readexactly(n)).decode()


@pytest.mark.slow
async def test_cross_process_receiver_gets_exact_tensors(sock_dir, sender):
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), f"unix://{sock_dir}/child.sock", cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            address = json.loads(await child.stdout.readline())["address"]
            big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB
            requests = {
                "r-small": {
                    "image_embeds": torch.randn(7, 33).to(torch.bfloat16),
                    "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),  # not contiguous
                    "mask": torch.tensor([0, 1, 255], dtype=torch.uint8),
                    "empty": torch.empty(0, 8, dtype=torch.float16),
                },
                "r-big": {"kv": big},
            }
            for rid, tensors in requests.items():
                descs = await sender.send(address, rid, tensors)
                child.stdin.write((json.dumps([d.model_dump() for d in descs]) + "\n").encode())
                await child.stdin.drain()
                got = json.loads(await child.stdout.readline())
                assert "error" not in got, got
                for name, t in tensors.items():
                    assert got[name]["dtype"] == str(t.dtype).removeprefix("torch.")
                    assert got[name]["shape"] == list(t.shape)
                    assert got[name]["crc"] == zlib.crc32(tensor_bytes(t))
                    assert got[name]["sum"] == pytest.approx(float(t.double().sum()))
            child.stdin.close()
            assert await child.wait() == 0
        assert not (sock_dir / "child.sock").exists()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_concurrent_sends_share_one_connection(open_receiver, sender, monkeypatch):
    opened = _count_opens(monkeypatch)
    r = await open_receiver()
    tensors = {f"req{i}": torch.randn(i * 1000 + 1) for i in range(16)}
    async with asyncio.timeout(10):
        descs = await asyncio.gather(*(sender.send(r.address, rid, {"x": t}) for rid, t in tensors.items()))
        for t, d in zip(tensors.values(), descs, strict=True):
            assert torch.equal((await r.recv(d, timeout=1))["x"], t)
    assert opened == [r.address]


async def test_send_returns_once_received_and_each_tensor_is_delivered_once(open_receiver, sender):
    r = await open_receiver()
    t = torch.randn(4, 4)
    async with asyncio.timeout(10):
        descs = await sender.send(r.address, "r1", {"x": t})
        assert r.pending_bytes == t.numel() * 4  # already verified and stored when send() returned
        assert torch.equal((await r.recv(descs, timeout=1))["x"], t)
        assert r.pending_bytes == 0
        with pytest.raises(TransportError, match="did not all arrive"):
            await r.recv(descs, timeout=0.1)


async def test_recv_waits_for_tensors_sent_later_in_parts(open_receiver, sender):
    r = await open_receiver()
    img, audio = torch.randn(3), torch.randn(5)
    want = [describe("r1", "image", img)[0], describe("r1", "audio", audio)[0]]
    async with asyncio.timeout(10):
        waiting = asyncio.create_task(r.recv(want, timeout=5))
        await sender.send(r.address, "r1", {"image": img})
        await asyncio.sleep(0.05)
        assert not waiting.done()  # half of the request is not enough
        await sender.send(r.address, "r1", {"audio": audio})
        got = await waiting
    assert torch.equal(got["image"], img) and torch.equal(got["audio"], audio)


async def test_recv_times_out_with_a_clear_message(open_receiver):
    r = await open_receiver()
    desc = describe("never-sent", "image_embeds", torch.zeros(2))[0]
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"never-sent: tensors \['image_embeds'\] did not all arrive"):
        await r.recv([desc], timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2


async def test_recv_refuses_tensors_that_differ_from_the_descriptor(open_receiver, sender):
    r = await open_receiver()
    async with asyncio.timeout(10):
        (sent,) = await sender.send(r.address, "r1", {"x": torch.ones(3)})
        other = describe("r1", "x", torch.zeros(3))[0]
        with pytest.raises(TransportError, match="asked for"):
            await r.recv([other], timeout=1)
        assert torch.equal((await r.recv([sent], timeout=1))["x"], torch.ones(3))


async def test_unclaimed_tensors_expire_and_discard_drops(open_receiver, sender):
    r = await open_receiver(ttl=2.0)  # long enough that a stalled 2-core machine cannot expire "old" early
    async with asyncio.timeout(15):
        (old,) = await sender.send(r.address, "old", {"x": torch.ones(1000)})
        await sender.send(r.address, "aborted", {"x": torch.ones(10)})
        assert r.pending_bytes == 4040
        await r.discard("aborted")
        assert r.pending_bytes == 4000
        deadline = asyncio.get_running_loop().time() + 6
        while r.pending_bytes and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert r.pending_bytes == 0
        with pytest.raises(TransportError, match="did not all arrive"):
            await r.recv([old], timeout=0.05)


async def test_corrupted_frame_gets_an_error_reply_and_the_connection_keeps_serving(open_receiver):
    r = await open_receiver()
    good_desc, raw = describe("good", "x", torch.arange(6, dtype=torch.int32))
    bad = good_desc.model_dump() | {"request_id": "bad"}  # same bytes, so the checksum (of "bad") is wrong below
    bad["checksum"] ^= 0xFFFF
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_unix_connection(r.address.removeprefix("unix://"))
        try:
            writer.write(_frame([bad], bytes(raw)))
            status, text = await _reply(reader)
            assert status == 1 and "checksum" in text
            writer.write(_frame([good_desc.model_dump()], bytes(raw)))
            assert await _reply(reader) == (0, "")
        finally:
            writer.close()
        assert torch.equal((await r.recv([good_desc], timeout=1))["x"], torch.arange(6, dtype=torch.int32))
        assert r.pending_bytes == 0  # nothing of "bad" was kept


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (_frame([], b"", magic=b"HTTP"), "not a tierserve frame"),
        (_frame([], b"", version=9), "not a tierserve frame"),
        (b"TSRV\x02" + struct.pack("!I", 2) + b"{]", "invalid header"),
        (_frame([{"request_id": "r", "name": "x", "dtype": "complex", "shape": [1], "nbytes": 8, "checksum": 0}], b""),
         "invalid header"),
        (b"TSRV\x02" + struct.pack("!I", 1 << 30), "exceeds max_header"),
    ],
)
async def test_malformed_frames_get_an_error_reply_then_close(open_receiver, sender, frame, reason):
    r = await open_receiver()
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_unix_connection(r.address.removeprefix("unix://"))
        writer.write(frame)
        status, text = await _reply(reader)
        assert status == 2 and reason in text
        assert await reader.read() == b""  # closed: the stream cannot be trusted after this
        writer.close()
        await sender.send(r.address, "after", {"x": torch.ones(2)})  # still serving others


@pytest.mark.parametrize("address", [None, "tcp://127.0.0.1:0"], ids=["unix", "tcp"])
async def test_oversized_payload_is_refused_with_its_reason_and_sender_recovers(open_receiver, sender, address):
    # far bigger than the socket buffers: the receiver refuses and hangs up while the sender is still writing
    r = await open_receiver(address, max_payload=1 << 20)
    async with asyncio.timeout(10):
        for _ in range(2):
            with pytest.raises(TransportError, match=rf"{re.escape(r.address)} rejected big: .*max_payload=1048576"):
                await sender.send(r.address, "big", {"x": torch.zeros(8 << 20, dtype=torch.uint8)})
        assert r.pending_bytes == 0
        await sender.send(r.address, "small", {"x": torch.zeros(10)})
        assert r.pending_bytes == 40


async def test_dead_or_malformed_addresses_raise_transport_error(sock_dir, sender):
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with asyncio.timeout(10):
        with pytest.raises(TransportError, match=r"cannot connect to unix://.*gone\.sock .*receiving worker running"):
            await sender.send(f"unix://{sock_dir}/gone.sock", "r1", {"x": torch.ones(1)})
        with pytest.raises(TransportError, match=rf"cannot connect to tcp://127\.0\.0\.1:{port}"):
            await sender.send(f"tcp://127.0.0.1:{port}", "r1", {"x": torch.ones(1)})
        with pytest.raises(TransportError, match="unknown address 'shm://x'"):
            await sender.send("shm://x", "r1", {"x": torch.ones(1)})


async def test_sender_reconnects_once_after_receiver_restart(open_receiver, sender, sock_dir, monkeypatch):
    opened = _count_opens(monkeypatch)
    address = f"unix://{sock_dir}/restart.sock"
    first = await open_receiver(address)
    async with asyncio.timeout(10):
        await sender.send(address, "r1", {"x": torch.ones(1)})
        await first.close()
        second = await open_receiver(address)
        await sender.send(address, "r2", {"x": torch.ones(2)})
    assert second.pending_bytes == 8 and len(opened) == 2


async def test_sender_retries_a_broken_pooled_connection_once_but_not_a_fresh_one(sock_dir, sender, monkeypatch):
    """A receiver that reads a frame and dies before replying: on connection 1 for r2, on every connection for r3."""
    opened = _count_opens(monkeypatch)
    frames, accepted = [], []

    async def serve(reader, writer):
        accepted.append(writer)
        me = len(accepted)
        try:
            while True:
                _, _, hlen = struct.unpack("!4sBI", await reader.readexactly(9))
                descs = json.loads(await reader.readexactly(hlen))["descs"]
                await reader.readexactly(sum(d["nbytes"] for d in descs))
                rid = descs[0]["request_id"]
                frames.append((me, rid))
                if (me, rid) == (1, "r2") or rid == "r3":
                    return
                writer.write(struct.pack("!BI", 0, 0))
        finally:
            writer.close()

    path = sock_dir / "flaky.sock"
    server = await asyncio.start_unix_server(serve, str(path))
    try:
        async with asyncio.timeout(10):
            for rid in ("r1", "r2"):
                await sender.send(f"unix://{path}", rid, {"x": torch.ones(3)})
            with pytest.raises(TransportError, match=r"connection to unix://.*flaky\.sock broke while sending r3"):
                await sender.send(f"unix://{path}", "r3", {"x": torch.ones(3)})
    finally:
        server.close()
        path.unlink()
    assert frames == [(1, "r1"), (1, "r2"), (2, "r2"), (2, "r3"), (3, "r3")]
    assert len(opened) == 3


async def test_tcp_on_loopback_reports_the_chosen_port(open_receiver, sender):
    r = await open_receiver("tcp://127.0.0.1:0")
    assert r.address.startswith("tcp://127.0.0.1:") and not r.address.endswith(":0")
    async with asyncio.timeout(10):
        descs = await sender.send(r.address, "r1", {"x": torch.arange(5)})
        assert torch.equal((await r.recv(descs, timeout=1))["x"], torch.arange(5))
    for exposed in ("tcp://0.0.0.0:0", "tcp://localhost:0"):
        with pytest.raises(TransportError, match=r"listens on 127\.0\.0\.1 or ::1 only"):
            LocalReceiver(exposed)


async def test_socket_file_handling(open_receiver, sock_dir):
    live = await open_receiver()
    with pytest.raises(TransportError, match="live receiver"):
        await LocalReceiver(live.address).start()
    stale = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # leaves the file behind, like a crashed worker
    await open_receiver(f"unix://{stale}")
    with pytest.raises(TransportError, match="longer than 107 bytes"):
        await LocalReceiver(f"unix://{sock_dir}/{'x' * 120}.sock").start()


async def test_close_fails_waiting_recv_and_removes_the_socket(sock_dir):
    r = LocalReceiver(f"unix://{sock_dir}/closing.sock")
    await r.start()
    assert (sock_dir / "closing.sock").exists()
    waiting = asyncio.create_task(r.recv([describe("r1", "x", torch.ones(1))[0]], timeout=5))
    await asyncio.sleep(0.01)
    await r.close()
    with pytest.raises(TransportError, match="closed"):
        await asyncio.wait_for(waiting, 1)
    assert not (sock_dir / "closing.sock").exists()


async def test_descriptor_json_is_what_the_header_carries(open_receiver, sender):
    """Descriptors from send() survive the control plane (JSON) and still match at the receiver."""
    r = await open_receiver()
    async with asyncio.timeout(10):
        descs = await sender.send(r.address, "r1", {"x": torch.randn(2, 3).to(torch.float16)})
        relayed = [TensorDescriptor.model_validate_json(d.model_dump_json()) for d in descs]
        assert (await r.recv(relayed, timeout=1))["x"].shape == (2, 3)
