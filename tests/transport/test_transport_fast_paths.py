"""What the ucx and nixl backends do differently from local/tcp: the CRC32 is checked when the engine
claims the tensors (not before send() returns), it can be switched off, and nixl senders WRITE into a
grant of the receiver's pool that credits refill, so a full grant is back-pressure and a closed sender's
grant goes back to the pool."""

import asyncio
import gc

import pytest
import torch

from transport.base import TransportError
from transport.registry import make_receiver, make_sender, unavailable


def backend(kind: str):
    reason = unavailable(kind)
    return pytest.param(kind, id=kind, marks=pytest.mark.skipif(reason is not None, reason=reason or ""))


FAST = [backend("ucx"), backend("nixl")]
NIXL = pytest.mark.skipif(unavailable("nixl") is not None, reason=unavailable("nixl") or "")


async def _pair(kind: str, sender_opts: dict | None = None, **receiver_opts):
    receiver = make_receiver(kind, "fast", **receiver_opts)
    await receiver.start()
    return receiver, make_sender(kind, timeout=10.0, **(sender_opts or {}))


@pytest.mark.parametrize("kind", FAST)
async def test_checksum_none_sends_no_crc_and_still_checks_the_layout(kind):
    receiver, sender = await _pair(kind, {"checksum": "none"})
    try:
        async with asyncio.timeout(30):
            t = torch.randn(3, 1000).to(torch.bfloat16)
            descs = await sender.send(receiver.address, "r1", {"x": t})
            assert descs[0].checksum is None
            assert torch.equal((await receiver.recv(descs, timeout=5))["x"], t)
            descs = await sender.send(receiver.address, "r2", {"x": t})
            wrong = [descs[0].model_copy(update={"shape": (1000, 3)})]
            with pytest.raises(TransportError, match="asked for"):
                await receiver.recv(wrong, timeout=5)
    finally:
        await sender.close()
        await receiver.close()


@pytest.mark.parametrize("kind", FAST)
async def test_bytes_damaged_after_arrival_fail_the_claim(kind):
    receiver, sender = await _pair(kind)
    try:
        async with asyncio.timeout(30):
            t = torch.arange(4096, dtype=torch.int32)
            descs = await sender.send(receiver.address, "r1", {"x": t})
            assert descs[0].checksum is not None
            await asyncio.sleep(0.05)
            receiver._drain() if kind == "nixl" else None  # file the notification (recv() would)
            arrived = receiver._inbox._arrived["r1"]["x"][1]  # as if the transfer had torn or been overwritten
            arrived.view(torch.uint8)[7] ^= 0x10
            with pytest.raises(TransportError, match="damaged or overwritten"):
                await receiver.recv(descs, timeout=5)
    finally:
        await sender.close()
        await receiver.close()


@NIXL
async def test_a_full_grant_holds_the_sender_until_the_engine_drops_a_tensor():
    receiver, sender = await _pair("nixl", pool_bytes=2 << 20, lend_limit=1.0)  # 2 MB granted, all lent
    try:
        async with asyncio.timeout(30):
            held = []
            for i in range(2):
                descs = await sender.send(receiver.address, f"r{i}", {"x": torch.full((256 << 10,), float(i))})
                held.append((await receiver.recv(descs, timeout=5))["x"])
            third = asyncio.ensure_future(sender.send(receiver.address, "r2", {"x": torch.ones(256 << 10)}))
            await asyncio.sleep(0.3)
            assert not third.done(), "the grant is full: the sender must wait"
            del held[0]
            gc.collect()  # the engine drops a tensor: its blocks are credited back
            descs = await third
            assert torch.equal((await receiver.recv(descs, timeout=5))["x"], torch.ones(256 << 10))
            assert torch.equal(held[0], torch.full((256 << 10,), 1.0))
    finally:
        await sender.close()
        await receiver.close()


@NIXL
async def test_a_grant_held_forever_times_out_with_the_reason():
    receiver = make_receiver("nixl", "held", pool_bytes=1 << 20, lend_limit=1.0)
    await receiver.start()
    sender = make_sender("nixl", timeout=1.0)
    try:
        async with asyncio.timeout(30):
            descs = await sender.send(receiver.address, "r0", {"x": torch.zeros(256 << 10)})
            kept = await receiver.recv(descs, timeout=5)
            with pytest.raises(TransportError, match="pool stayed full"):
                await sender.send(receiver.address, "r1", {"x": torch.zeros(256 << 10)})
            del kept
    finally:
        await sender.close()
        await receiver.close()


@NIXL
async def test_a_closed_sender_gives_its_grant_back_to_the_pool():
    receiver = make_receiver("nixl", "grants", pool_bytes=1 << 20, slab_bytes=1 << 20)
    await receiver.start()
    first, second = make_sender("nixl", timeout=5.0), make_sender("nixl", timeout=5.0)
    try:
        async with asyncio.timeout(30):
            await receiver.recv(await first.send(receiver.address, "a", {"x": torch.ones(10)}), timeout=5)
            with pytest.raises(TransportError, match="refused this sender: all 1048576 bytes"):
                await second.send(receiver.address, "b", {"x": torch.ones(10)})
            await first.close()  # says Bye: the receiver takes the grant back
            await asyncio.sleep(0.2)
            got = await receiver.recv(await second.send(receiver.address, "c", {"x": torch.ones(10)}), timeout=5)
            assert torch.equal(got["x"], torch.ones(10))
    finally:
        await first.close()
        await second.close()
        await receiver.close()
