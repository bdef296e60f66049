"""Two hosts on one machine: network namespaces joined by a veth pair, sender in one, receiver in the other.

UCX (and NIXL's UCX) are pinned to the veth device and to TCP, so the bytes really cross the link rather
than shared memory (namespaces share /dev/shm). Needs root (CAP_NET_ADMIN); skipped with the reason otherwise.
"""

import asyncio
import json
import secrets
import subprocess

import pytest
from tensor_cases import cases
from test_transport_contract import Child, backend, check

from transport.wire import TensorDescriptor

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def two_hosts():
    """(namespace, device, address) for host A and host B; always deleted afterwards."""
    tag = secrets.token_hex(3)
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    a, b = ((f"ts-{side}-{tag}", f"vts{side}{tag}", f"{subnet}.{n}") for side, n in (("a", 1), ("b", 2)))
    created: list[str] = []
    try:
        for ns, _, _ in (a, b):
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create network namespaces here ({r.stderr.strip()}): needs root / CAP_NET_ADMIN")
            created.append(ns)
        steps = [("link", "add", a[1], "type", "veth", "peer", "name", b[1])]
        for ns, dev, addr in (a, b):
            steps += [("link", "set", dev, "netns", ns), ("-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
                      ("-n", ns, "link", "set", dev, "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"cannot build the veth link (ip {' '.join(step)}: {r.stderr.strip()})")
        yield a, b
    finally:
        for ns in created:
            _ip("netns", "del", ns)  # deletes the veth pair with it


def _rx_bytes(ns: str, dev: str) -> int:
    r = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/rx_bytes"],
                       capture_output=True, text=True, timeout=10)
    return int(r.stdout)


def _env(dev: str) -> dict:
    return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev, "UCX_WARN_UNUSED_ENV_VARS": "n"}


@pytest.mark.parametrize("kind", [backend(k) for k in ("tcp", "ucx", "nixl")])
async def test_tensors_cross_a_veth_link_bit_exact(kind, two_hosts):
    (ns_a, dev_a, _), (ns_b, dev_b, addr_b) = two_hosts
    rx_before = _rx_bytes(ns_b, dev_b)
    receiver = await Child.start(kind, "recv", addr_b, prefix=("ip", "netns", "exec", ns_b), env=_env(dev_b))
    sender = None
    try:
        address = json.loads(await receiver.line(120))["address"]
        if kind == "tcp":
            assert address == f"tcp://{addr_b}:{address.rsplit(':', 1)[1]}"
        sender = await Child.start(kind, "send", address, prefix=("ip", "netns", "exec", ns_a), env=_env(dev_a))
        sent = json.loads(await sender.line(180))
        async with asyncio.timeout(120):
            for rid, tensors in cases().items():
                check(await receiver.ask([TensorDescriptor.model_validate(d) for d in sent[rid]]), tensors)
        assert await sender.finish() == 0
        assert await receiver.finish() == 0
        payload = sum(t.nbytes for tensors in cases().values() for t in tensors.values())
        assert _rx_bytes(ns_b, dev_b) - rx_before > payload, "the bytes did not cross the veth link"
    finally:
        for child in (sender, receiver):
            if child is not None:
                await child.kill()
