"""A receiver in its own process, for the cross-process tests.

argv[1] is the address to listen on. It prints {"address": ...} once listening, then for each line of
descriptors (JSON) on stdin prints what it received: per tensor dtype, shape, CRC32 of its bytes and sum.
EOF on stdin closes the receiver and exits.
"""

import asyncio
import json
import sys
import zlib

from transport.local import LocalReceiver
from transport.wire import TensorDescriptor, dtype_name, tensor_bytes


async def main(address: str) -> None:
    receiver = LocalReceiver(address)
    await receiver.start()
    print(json.dumps({"address": receiver.address}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            descs = [TensorDescriptor.model_validate(d) for d in json.loads(line)]
            try:
                got = await receiver.recv(descs, timeout=10.0)
                out = {
                    name: {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                           "crc": zlib.crc32(tensor_bytes(t)), "sum": float(t.double().sum())}
                    for name, t in got.items()
                }
            except Exception as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), flush=True)
    finally:
        await receiver.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
