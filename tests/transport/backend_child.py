"""One end of a transport in its own process, for the cross-process contract and multi-host tests.

    backend_child.py KIND recv [HOST]   prints {"address": ...}; then per stdin line of descriptors (JSON)
                                        prints per tensor dtype, shape and CRC32 (or {"error": ...}); EOF ends it
    backend_child.py KIND send ADDRESS  sends the tensors of tensor_cases.py, prints their descriptors, exits
    backend_child.py KIND flood ADDRESS prints "started", then sends 32 MB tensors until killed

Every wait is bounded; exit status 0 means a clean close. TS_CHILD_SECRET in the environment, if set, is
the cluster secret both ends use (the forgery tests).
"""

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from tensor_cases import cases  # noqa: E402

from transport.checksum import crc32  # noqa: E402
from transport.registry import make_receiver, make_sender  # noqa: E402
from transport.wire import TensorDescriptor, dtype_name, tensor_bytes  # noqa: E402


async def receive(kind: str, host: str | None) -> None:
    opts = {"host": host} if host and kind == "tcp" else {}
    receiver = make_receiver(kind, "child", secret=_secret(), **({"tcp": True} if kind == "local" else opts))
    await receiver.start()
    print(json.dumps({"address": receiver.address}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(1000):
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            descs = [TensorDescriptor.model_validate(d) for d in json.loads(line)]
            try:
                got = await receiver.recv(descs, timeout=20.0)
                out = {name: {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "crc": crc32(tensor_bytes(t))}
                       for name, t in got.items()}
            except Exception as e:  # noqa: BLE001 - reported to the test
                out = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), flush=True)
    finally:
        await asyncio.wait_for(receiver.close(), 20)


async def send(kind: str, address: str, flood: bool) -> None:
    sender = make_sender(kind, timeout=20.0, secret=_secret())
    try:
        if flood:
            big = torch.randn(8 << 20)
            print("started", flush=True)
            for i in range(100_000):
                await sender.send(address, f"flood-{i}", {"kv": big})
            return
        out = {}
        for rid, tensors in cases().items():
            out[rid] = [d.model_dump() for d in await sender.send(address, rid, tensors)]
        print(json.dumps(out), flush=True)
    finally:
        await asyncio.wait_for(sender.close(), 20)


def _secret() -> bytes | None:
    value = os.environ.get("TS_CHILD_SECRET")
    return value.encode() if value else None


if __name__ == "__main__":
    kind, role = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else None
    coro = receive(kind, arg) if role == "recv" else send(kind, arg, role == "flood")
    asyncio.run(asyncio.wait_for(coro, 300))
