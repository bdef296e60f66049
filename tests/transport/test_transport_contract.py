"""One contract, every backend, two real processes: bytes arrive bit-exact, every wait has a deadline,
and a peer that dies or vanishes ends the transfer with a TransportError in bounded time."""

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from tensor_cases import cases

from transport.base import TransportError
from transport.checksum import crc32
from transport.registry import make_receiver, make_sender, unavailable
from transport.wire import TensorDescriptor, describe, dtype_name, tensor_bytes

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("backend_child.py")
KINDS = ["local", "tcp", "ucx", "nixl"]
pytestmark = pytest.mark.slow


def backend(kind: str):
    reason = unavailable(kind)
    return pytest.param(kind, id=kind, marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


BACKENDS = [backend(k) for k in KINDS]


class Child:
    """A backend_child.py process with bounded reads; always killed at the end of the test."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, kind: str, *args: str, prefix: tuple[str, ...] = (), env: dict | None = None) -> "Child":
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, str(CHILD), kind, *args, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return cls(proc)

    async def line(self, timeout: float = 60.0) -> str:
        try:
            text = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise AssertionError(f"child printed nothing within {timeout}s") from None
        if not text:
            err = await asyncio.wait_for(self.proc.stderr.read(), 10)
            raise AssertionError(f"child ended (rc={self.proc.returncode}): {err.decode()[-2000:]}")
        return text.decode()

    async def ask(self, descs: list[TensorDescriptor]) -> dict:
        self.proc.stdin.write((json.dumps([d.model_dump() for d in descs]) + "\n").encode())
        await self.proc.stdin.drain()
        return json.loads(await self.line())

    async def finish(self, timeout: float = 30.0) -> int:
        if self.proc.stdin and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(self.proc.wait(), 10)


def check(got: dict, tensors: dict[str, torch.Tensor]) -> None:
    assert "error" not in got, got
    for name, t in tensors.items():
        assert got[name]["dtype"] == dtype_name(t.dtype), name
        assert got[name]["shape"] == list(t.shape), name
        assert got[name]["crc"] == crc32(tensor_bytes(t)), f"{name}: bytes differ"


@pytest.mark.parametrize("kind", BACKENDS)
async def test_parent_sends_to_a_receiver_process_bit_exact(kind):
    child = await Child.start(kind, "recv")
    sender = make_sender(kind, timeout=20.0)
    try:
        address = json.loads(await child.line())["address"]
        async with asyncio.timeout(120):
            for rid, tensors in cases().items():
                descs = await sender.send(address, rid, tensors)
                check(await child.ask(descs), tensors)
        assert await child.finish() == 0
    finally:
        await sender.close()
        await child.kill()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_sender_process_to_parent_receiver_bit_exact(kind):
    receiver = make_receiver(kind, "parent", **({"tcp": True} if kind == "local" else {}))
    await receiver.start()
    child = await Child.start(kind, "send", receiver.address)
    try:
        sent = json.loads(await child.line(120))
        async with asyncio.timeout(60):
            for rid, tensors in cases().items():
                descs = [TensorDescriptor.model_validate(d) for d in sent[rid]]
                got = await receiver.recv(descs, timeout=10)
                for name, t in tensors.items():
                    assert got[name].dtype == t.dtype and got[name].shape == t.shape
                    assert bytes(tensor_bytes(got[name])) == bytes(tensor_bytes(t)), f"{rid}/{name}"
        assert await child.finish() == 0
    finally:
        await child.kill()
        await receiver.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_recv_has_a_deadline(kind):
    receiver = make_receiver(kind, "deadline", **({"tcp": True} if kind == "local" else {}))
    await receiver.start()
    try:
        start = time.monotonic()
        with pytest.raises(TransportError, match="did not all arrive"):
            await receiver.recv([describe("never", "x", torch.zeros(3))[0]], timeout=0.3)
        assert time.monotonic() - start < 3
    finally:
        await receiver.close()


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("how", ["killed", "vanished"])
async def test_send_to_a_dead_receiver_fails_in_bounded_time(kind, how):
    child = await Child.start(kind, "recv")
    sender = make_sender(kind, timeout=3.0)
    try:
        address = json.loads(await child.line())["address"]
        async with asyncio.timeout(30):
            descs = await sender.send(address, "first", {"x": torch.ones(1000)})  # endpoints are up and pooled
            assert "error" not in await child.ask(descs)
            if how == "killed":
                await child.kill()
            else:
                assert await child.finish() == 0
            start = time.monotonic()
            with pytest.raises(TransportError):
                for i in range(3):  # a first send may still land in a buffer of the dead peer
                    await sender.send(address, f"after-{i}", {"x": torch.ones(1 << 20)})
            assert time.monotonic() - start < 3 * 3.0 + 5
    finally:
        await sender.close()
        await child.kill()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_receiver_survives_a_sender_killed_mid_transfer(kind):
    receiver = make_receiver(kind, "survivor", **({"tcp": True} if kind == "local" else {}), ttl=5.0)
    await receiver.start()
    child = await Child.start(kind, "flood", receiver.address)
    sender = make_sender(kind, timeout=10.0)
    try:
        assert (await child.line(120)).strip() == "started"
        await asyncio.sleep(0.5)
        await child.kill()
        async with asyncio.timeout(30):
            t = torch.randn(1000)
            descs = await sender.send(receiver.address, "after", {"x": t})
            assert torch.equal((await receiver.recv(descs, timeout=5))["x"], t)
    finally:
        await sender.close()
        await child.kill()
        await asyncio.wait_for(receiver.close(), 30)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_an_oversized_send_is_refused_with_its_reason_and_the_sender_recovers(kind):
    limit = {"pool_bytes": 4 << 20} if kind == "nixl" else {"max_payload": 4 << 20}
    receiver = make_receiver(kind, "small", **({"tcp": True} if kind == "local" else {}), **limit)
    await receiver.start()
    sender = make_sender(kind, timeout=10.0)
    try:
        async with asyncio.timeout(60):
            for _ in range(2):
                with pytest.raises(TransportError, match=r"rejected big: .*(max_payload=4194304|pool_bytes)"):
                    await sender.send(receiver.address, "big", {"x": torch.zeros(2 << 20)})  # 8 MB
            t = torch.randn(1000)
            descs = await sender.send(receiver.address, "after", {"x": t})
            assert torch.equal((await receiver.recv(descs, timeout=5))["x"], t)
    finally:
        await sender.close()
        await receiver.close()
