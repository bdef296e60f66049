"""CRC32 of tensor bytes, as fast as this machine allows.

Every transfer is checksummed twice (the sender for the descriptor, the receiver to verify), so the
checksum bounds the speed of every backend: zlib's CRC32 runs at about 1.5 GB/s, ISA-L's (the `isal`
wheel, same polynomial, same values) at about 25 GB/s, half the speed of a copy (4.5 MB: 0.17 ms against
0.34 ms here). Both give identical results, so peers with and without `isal` interoperate. The ucx and
nixl backends keep it off send()'s path where they can (transport/README.md); senders can skip it with
checksum="none". `off_loop` decides where the checksum (and copies of that size) run: event loop or thread.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - depends on the install
    _fast_crc32 = None

crc32: Callable[[bytes | bytearray | memoryview], int] = _fast_crc32 or zlib.crc32
"""zlib-compatible CRC32; ISA-L's when installed (`pip install isal`), zlib's otherwise."""

FAST = _fast_crc32 is not None
"""Whether the accelerated CRC32 is in use (reported by the transport benchmark)."""

OFF_LOOP = (16 << 20) if FAST else (1 << 20)
"""Tensors of at least this many bytes are checksummed and copied in a worker thread, so the engine's event
loop never stalls for long. A hop to a thread costs 0.1-1 ms on a loaded 2-core machine, more than ISA-L's
CRC32 of 4.5 MB (0.2 ms), so with ISA-L only big KV blocks go off the loop; with zlib (1.5 GB/s) 1 MB does."""


async def off_loop(nbytes: int, fn, *args):
    """Run fn in a thread when the tensor is big, so checksumming never stalls the engine's event loop."""
    return await asyncio.to_thread(fn, *args) if nbytes >= OFF_LOOP else fn(*args)
