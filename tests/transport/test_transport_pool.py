import asyncio
import gc

import pytest
import torch

from transport.base import TransportError
from transport.messages import MAX_CONTROL, ControlError, Offer, Reply, pack, unpack
from transport.pool import BlockPool, RecvBuffers
from transport.registry import make_receiver, make_sender, unavailable
from transport.wire import describe, rebuild


def test_block_pool_first_fit_and_merge():
    pool = BlockPool(8, 16)
    a, b, c = pool.alloc(16), pool.alloc(33), pool.alloc(1)
    assert (a, b, c) == (0, 1, 4) and pool.used_fraction == 5 / 8
    assert pool.alloc(16 * 4) is None  # only 3 blocks left
    pool.free(b, 33)
    assert pool.alloc(16 * 3) == 1  # the freed run is reused
    pool.free(1, 48), pool.free(a, 16), pool.free(c, 1)
    assert pool.used_fraction == 0 and pool.alloc(16 * 8) == 0  # everything merged back into one run


def test_lent_blocks_come_back_only_when_the_last_view_dies():
    buffers = RecvBuffers(1 << 20, block_bytes=1 << 16, lend_limit=0.5)
    t = torch.randn(4096)
    desc, raw = describe("r", "x", t)
    view = buffers.take(desc.nbytes)
    view[:] = raw
    out = rebuild(desc, view)
    del view
    part = out[100:200]
    del out
    gc.collect()
    assert buffers.pool.used_fraction > 0  # a slice still uses the blocks
    assert torch.equal(part, t[100:200])
    del part
    gc.collect()
    assert buffers.pool.used_fraction == 0


def test_a_full_pool_falls_back_to_fresh_memory():
    buffers = RecvBuffers(1 << 18, block_bytes=1 << 16, lend_limit=0.5)
    held = [buffers.take(1 << 16) for _ in range(3)]  # the third no longer comes from the pool
    assert buffers.pool.used_fraction == 0.5 and all(len(h) == 1 << 16 for h in held)
    del held
    gc.collect()
    assert buffers.pool.used_fraction == 0


def test_control_messages_round_trip_and_refuse_garbage():
    desc = describe("r1", "x", torch.ones(3))[0]
    offer = Offer(reply_to="ucx://abc", tag=(5 << 32) | 7, descs=[desc])
    assert unpack(pack(offer)) == offer
    assert unpack(pack(Reply(xid=3, status=1, text="no"))).text == "no"
    for bad in (b"", b"\x05\x00\x00\x00{}", b"\x02\x00\x00\x00{}", b"\x0f\x00\x00\x00{\"kind\": \"nope\"}   "):
        with pytest.raises(ControlError):
            unpack(bad)
    with pytest.raises(ControlError, match="send fewer tensors"):
        pack(Reply(xid=1, status=1, text="x" * MAX_CONTROL))


@pytest.mark.skipif(unavailable("nixl") is not None, reason=unavailable("nixl") or "")
async def test_nixl_receiver_copies_when_its_pool_is_held_and_refuses_what_cannot_fit():
    receiver = make_receiver("nixl", "small", pool_bytes=4 << 20)
    await receiver.start()
    sender = make_sender("nixl", timeout=10.0, pool_bytes=8 << 20)
    try:
        async with asyncio.timeout(60):
            held = []
            for i in range(4):  # the engine keeps every tensor: the pool fills, then transfers copy out of it
                t = torch.full((256 << 10,), float(i))  # 1 MB
                descs = await sender.send(receiver.address, f"r{i}", {"x": t})
                held.append((await receiver.recv(descs, timeout=5))["x"])
                assert torch.equal(held[-1], t)
            with pytest.raises(TransportError, match="raise its pool_bytes"):
                await sender.send(receiver.address, "huge", {"x": torch.zeros(2 << 20)})  # 8 MB > 4 MB pool
            descs = await sender.send(receiver.address, "after", {"x": torch.ones(10)})
            assert torch.equal((await receiver.recv(descs, timeout=5))["x"], torch.ones(10))
    finally:
        await sender.close()
        await receiver.close()
