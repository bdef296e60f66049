"""libsmctrl (TPC masks for SM partitioning), loaded lazily.

Only the availability probe lives here so far; the per-micro-batch partitioning that uses it is the
encode-as-control-point issue. On a machine without an NVIDIA GPU or without the library this says so,
and encode workers run unpartitioned.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


def probe(lib_path: str | None = None) -> Availability:
    """Can this process partition SMs? Never raises; the reason says what is missing."""
    path = lib_path or os.environ.get("TIERSERVE_LIBSMCTRL") or ctypes.util.find_library("smctrl")
    if not path:
        return Availability(False, "libsmctrl not found: build it (native/README) and set TIERSERVE_LIBSMCTRL")
    try:
        ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
    except OSError:
        return Availability(False, "no CUDA driver (libcuda) on this machine: SM partitioning needs an NVIDIA GPU")
    try:
        ctypes.CDLL(path)
    except OSError as e:
        return Availability(False, f"libsmctrl at {path} failed to load: {e}")
    return Availability(True, f"libsmctrl loaded from {path}")
