"""What every native wrapper answers before it does anything: can it run here, and if not, why."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass


@dataclass(frozen=True)
class Availability:
    """Whether a native backend can be used in this process."""

    ok: bool
    """True when the backend loaded and answered."""
    reason: str
    """What was loaded from where, or (ok=False) what is missing, starting with "unsupported: "."""


class Unavailable(RuntimeError):
    """A native backend cannot be used here; str(e) is the reason, for logs and Availability."""


def load_libcuda(path: str | None = None) -> ctypes.CDLL:
    """The CUDA driver library (`path`, default libcuda.so.1), or Unavailable saying it is absent."""
    try:
        return ctypes.CDLL(path or "libcuda.so.1")
    except OSError as e:
        raise Unavailable(f"unsupported: no CUDA driver (libcuda): SM partitioning needs an NVIDIA GPU ({e})") from e
