"""Every backend with a cluster secret: a forged, replayed, stale, misaddressed, unexpected or oversized
transfer is refused and counted, and the real request still completes; unclaimed tensors go after the
retention time and their memory with them. Real transports; the real sender is a separate process."""

import asyncio
import json
import secrets
import time

import pytest
import torch
from tensor_cases import cases
from test_transport_contract import BACKENDS, Child

from transport.auth import Signer
from transport.base import TransportError
from transport.registry import make_receiver, make_sender
from transport.wire import TensorDescriptor, tensor_bytes

SECRET = b"cluster-secret-for-tests"
pytestmark = pytest.mark.slow


async def _receiver(kind: str, **opts):
    receiver = make_receiver(kind, "gate", secret=SECRET, **({"tcp": True} if kind == "local" else {}), **opts)
    await receiver.start()
    return receiver


def _sender(kind: str, **opts):
    return make_sender(kind, timeout=5.0, **({"connect_timeout": 2.0} if kind == "nixl" else {}), **opts)


async def _refused(kind, sender, receiver, rid, tensors, match, *, filed_refusal=True):
    """The refusal as the sender sees it: the reason from send() (local, tcp, ucx answer before the payload
    moves); nixl's WRITE is one-sided, so there the request's claim fails (at once with the reason when the
    receiver recorded it, else at its deadline)."""
    if kind != "nixl" or not filed_refusal:
        with pytest.raises(TransportError, match=match):
            await sender.send(receiver.address, rid, tensors)
        return
    descs = await sender.send(receiver.address, rid, tensors)
    with pytest.raises(TransportError, match=match):
        await receiver.recv(descs, timeout=2)


async def _moves(sender, receiver, rid: str, t: torch.Tensor) -> None:
    descs = await sender.send(receiver.address, rid, {"x": t})
    assert torch.equal((await receiver.recv(descs, timeout=5))["x"], t)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_transfers_without_the_secret_are_refused_and_the_real_ones_arrive(kind):
    receiver = await _receiver(kind)
    strangers = [_sender(kind), _sender(kind, secret=b"another-cluster")]
    child = None
    try:
        async with asyncio.timeout(120):
            for stranger in strangers:  # the real request ids: a forgery must not spoil them
                for rid, tensors in cases().items():
                    with pytest.raises(TransportError, match="authentication tag|did not answer"):
                        await stranger.send(receiver.address, rid, tensors)
                    if kind == "nixl":
                        break  # its Hello went unanswered: it never got to WRITE
            assert receiver.stats().refused_bad_mac >= 2
            assert receiver.stats().accepted == 0 and receiver.stats().unclaimed_bytes == 0
            child = await Child.start(kind, "send", receiver.address, env={"TS_CHILD_SECRET": SECRET.decode()})
            sent = json.loads(await child.line(120))
            for rid, tensors in cases().items():
                got = await receiver.recv([TensorDescriptor.model_validate(d) for d in sent[rid]], timeout=10)
                for name, t in tensors.items():
                    assert bytes(tensor_bytes(got[name])) == bytes(tensor_bytes(t)), f"{rid}/{name}"
            assert await child.finish() == 0
            assert receiver.stats().accepted == len(cases()) and receiver.stats().unclaimed_bytes == 0
    finally:
        for stranger in strangers:
            await stranger.close()
        if child is not None:
            await child.kill()
        await receiver.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_replayed_and_stale_transfers_are_refused(kind):
    receiver = await _receiver(kind)
    skew, repeat = [0.0], [False]
    signer = Signer(SECRET, clock=lambda: time.time() - skew[0],
                    nonce=lambda: "same" if repeat[0] else secrets.token_hex(16))
    sender = _sender(kind, signer=signer)
    try:
        async with asyncio.timeout(60):
            await _moves(sender, receiver, "first", torch.randn(100))  # nixl: Hello and grant done
            repeat[0] = True
            await _moves(sender, receiver, "r1", torch.randn(100))  # the first use of the nonce
            # nixl files no refusal for a tag it cannot trust: the claim runs into its deadline
            await _refused(kind, sender, receiver, "r2", {"x": torch.randn(100)}, "a replay|did not all arrive")
            assert receiver.stats().refused_replay == 1
            repeat[0], skew[0] = False, 120.0
            await _refused(kind, sender, receiver, "r3", {"x": torch.randn(100)}, "issued 120|did not all arrive")
            assert receiver.stats().refused_stale == 1
            skew[0] = 0.0
            await _moves(sender, receiver, "after", torch.randn(100))
            assert receiver.stats().unclaimed_bytes == 0
    finally:
        await sender.close()
        await receiver.close()


class _StampsFor(Signer):
    """Genuine stamps for one receiver, sent to another: what a relayed (or misrouted) transfer carries."""

    def __init__(self, address: str) -> None:
        super().__init__(SECRET)
        self.address = address

    def stamp(self, kind, address, body):
        return super().stamp(kind, self.address, body)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_transfer_stamped_for_another_receiver_is_refused(kind):
    meant, other = await _receiver(kind), await _receiver(kind, ttl=5.0)
    relay, sender = _sender(kind, signer=_StampsFor(meant.address)), _sender(kind, secret=SECRET)
    try:
        async with asyncio.timeout(60):
            with pytest.raises(TransportError, match="another receiver|did not answer"):
                await relay.send(other.address, "r1", {"x": torch.randn(100)})
            assert other.stats().refused_misaddressed == 1 and other.stats().accepted == 0
            await _moves(sender, other, "r1", torch.randn(100))
    finally:
        for end in (relay, sender, meant, other):
            await end.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_oversized_and_over_cap_transfers_are_refused_with_the_reason(kind):
    receiver = await _receiver(kind, max_unclaimed_bytes=4 << 20)
    sender = _sender(kind, secret=SECRET)
    try:
        async with asyncio.timeout(60):
            with pytest.raises(TransportError, match=r"rejected big: .*4194304"):
                await sender.send(receiver.address, "big", {"x": torch.zeros(2 << 20)})  # 8 MB, one request
            held = await sender.send(receiver.address, "a", {"x": torch.ones(3 << 18)})  # 3 MB, unclaimed
            await _refused(kind, sender, receiver, "b", {"x": torch.ones(3 << 18)}, "max_unclaimed_bytes=4194304")
            assert receiver.stats().refused_over_cap >= 2 - (kind == "nixl")  # nixl's sender refused "big" itself
            assert torch.equal((await receiver.recv(held, timeout=5))["x"], torch.ones(3 << 18))
            await _moves(sender, receiver, "b", torch.randn(3 << 18))  # claimed: room again
            assert receiver.stats().unclaimed_bytes == 0
    finally:
        await sender.close()
        await receiver.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_discarded_request_gets_nothing_more(kind):
    receiver = await _receiver(kind)
    sender = _sender(kind, secret=SECRET)
    try:
        async with asyncio.timeout(60):
            await receiver.discard("aborted")
            await _refused(kind, sender, receiver, "aborted", {"x": torch.randn(100)}, "discarded here")
            assert receiver.stats().refused_unexpected == 1 and receiver.stats().unclaimed_bytes == 0
            await _moves(sender, receiver, "live", torch.randn(100))
    finally:
        await sender.close()
        await receiver.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_unclaimed_tensors_go_after_the_retention_time_and_their_memory_with_them(kind):
    receiver = await _receiver(kind, ttl=0.5, max_unclaimed_bytes=2 << 20)
    sender = _sender(kind, secret=SECRET)
    try:
        async with asyncio.timeout(60):
            await sender.send(receiver.address, "forgotten", {"x": torch.ones(3 << 17)})  # 1.5 MB, never claimed
            await _refused(kind, sender, receiver, "next", {"x": torch.ones(3 << 17)}, "max_unclaimed_bytes")
            deadline = time.monotonic() + 10
            while receiver.stats().expired < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stats = receiver.stats()
            assert stats.expired == 1 and stats.unclaimed_bytes == 0 and receiver.pending_bytes == 0
            if kind in ("tcp", "ucx"):  # the receive buffers went back to the pool
                assert receiver._buffers.pool.used_fraction == 0
            if kind == "nixl":  # the blocks went back to the sender's grant
                assert all(slab.used == 0 for slab in receiver._slabs.values())
            await _moves(sender, receiver, "next", torch.randn(3 << 17))  # the room is back
    finally:
        await sender.close()
        await receiver.close()
