"""Mask arithmetic for SM partitioning, CPU-only: libsmctrl TPC masks and green-context SM rounding.

libsmctrl partitions at TPC granularity (a TPC is 2 SMs). Its masks are DISABLE masks: bit i SET
means TPC i may NOT run this stream's/process's kernels; a zero mask means "every TPC". The plain
API takes a uint64_t (TPCs 0-63); the `_ext` variant takes a 128-bit mask for GPUs with more than
64 TPCs, passed here as (low64, high64) words. Bits at or above the GPU's TPC count stay clear.

CUDA green contexts instead allocate groups of SMs with an architecture granularity (the CUDA 12
driver header: compute 8.x, Ampere and Ada, at least 4 SMs in steps of 2; compute 9.0+, Hopper, at
least 8 in steps of 8). A request is rounded up to that granularity, but never beyond what the GPU
can give, so a group can hold fewer SMs than asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from coordinator.policies.sm_partition import TPCSplit

Arch = Literal["ampere", "ada", "hopper"]

SMS_PER_TPC = 2
WORD_BITS = 64
MAX_TPCS = 128
"""The widest mask libsmctrl takes (the `_ext` API)."""
_WORD = (1 << WORD_BITS) - 1
GREEN_CONTEXT_GRANULARITY: Mapping[str, tuple[int, int]] = MappingProxyType(
    {"ampere": (4, 2), "ada": (4, 2), "hopper": (8, 8)})
"""arch -> (minimum SMs, step in SMs) of one green-context SM group."""


def _check_total(total_tpcs: int) -> None:
    if not 1 <= total_tpcs <= MAX_TPCS:
        raise ValueError(f"total_tpcs must be in [1, {MAX_TPCS}] (libsmctrl masks are at most 128 bits), "
                         f"got total_tpcs={total_tpcs!r}")


def _all(total_tpcs: int) -> int:
    return (1 << total_tpcs) - 1


def needs_ext(total_tpcs: int) -> bool:
    """Whether this GPU needs libsmctrl's 128-bit `_ext` API (more than 64 TPCs)."""
    _check_total(total_tpcs)
    return total_tpcs > WORD_BITS


def enable_mask(tpcs: range | Iterable[int], total_tpcs: int) -> int:
    """The libsmctrl mask that lets kernels run on exactly `tpcs` (every other TPC's bit set)."""
    _check_total(total_tpcs)
    enabled = 0
    for tpc in tpcs:
        if not 0 <= tpc < total_tpcs:
            raise ValueError(f"TPC {tpc!r} is outside this GPU's TPCs [0, {total_tpcs})")
        enabled |= 1 << tpc
    return _all(total_tpcs) & ~enabled


def enabled_tpcs(mask: int, total_tpcs: int) -> frozenset[int]:
    """The TPCs a libsmctrl mask lets kernels run on (its clear bits below total_tpcs)."""
    _check_mask(mask, total_tpcs)
    return frozenset(i for i in range(total_tpcs) if not mask >> i & 1)


def _check_mask(mask: int, total_tpcs: int) -> None:
    _check_total(total_tpcs)
    if not 0 <= mask <= _all(total_tpcs):
        raise ValueError(f"mask {mask:#x} has bits outside TPCs [0, {total_tpcs}) (total_tpcs={total_tpcs})")


def split_ranges(total_tpcs: int, first_tpcs: int) -> tuple[range, range]:
    """Two disjoint contiguous TPC ranges covering the GPU: the first `first_tpcs`, then the rest."""
    _check_total(total_tpcs)
    if not 0 <= first_tpcs <= total_tpcs:
        raise ValueError(f"first_tpcs must be in [0, {total_tpcs}], got first_tpcs={first_tpcs!r}")
    return range(first_tpcs), range(first_tpcs, total_tpcs)


def to_words(mask: int, total_tpcs: int) -> tuple[int, int]:
    """(low64, high64) of a mask, for the `_ext` API's 128-bit argument; high64 is 0 up to 64 TPCs."""
    _check_mask(mask, total_tpcs)
    return mask & _WORD, mask >> WORD_BITS


def from_words(low64: int, high64: int) -> int:
    """The inverse of to_words."""
    for name, word in (("low64", low64), ("high64", high64)):
        if not 0 <= word <= _WORD:
            raise ValueError(f"{name} must fit in 64 bits, got {name}={word:#x}")
    return high64 << WORD_BITS | low64


def masks_for(split: TPCSplit, total_tpcs: int) -> tuple[int, int]:
    """(encoder_mask, prefill_mask) for a policy split: encoder on TPCs [0, e), prefill on [e, e+p).

    The enabled sets are always disjoint. "none" mode gives (0, 0): no TPC disabled for either side,
    the unpartitioned GPU. A side with 0 TPCs gets a mask disabling every TPC: it has no work this
    micro-batch and must not launch (the runtime skips applying it rather than launch on nothing).
    """
    _check_total(total_tpcs)
    if split.mode == "none":
        return 0, 0
    e, p = split.encoder_tpcs, split.prefill_tpcs
    if e < 0 or p < 0 or e + p > total_tpcs:
        raise ValueError(f"split needs {e} + {p} TPCs but the GPU has total_tpcs={total_tpcs}")
    encoder = range(e)
    prefill = range(e, e + p)
    return enable_mask(encoder, total_tpcs), enable_mask(prefill, total_tpcs)


def round_sm_request(sms: int, arch: Arch, gpu_sms: int | None = None) -> int:
    """SMs a green context would actually get when asked for `sms` on `arch`.

    Rounded up to the architecture's minimum and step; with `gpu_sms` (the GPU's SM count) capped at
    the largest valid group the GPU can hold, so it may be fewer than asked.
    """
    if arch not in GREEN_CONTEXT_GRANULARITY:
        raise ValueError(f"arch must be one of {sorted(GREEN_CONTEXT_GRANULARITY)}, got arch={arch!r}")
    if sms < 1:
        raise ValueError(f"sms must be at least 1, got sms={sms!r}")
    least, step = GREEN_CONTEXT_GRANULARITY[arch]
    granted = max(least, -(-sms // step) * step)
    if gpu_sms is None:
        return granted
    largest = gpu_sms - gpu_sms % step
    if largest < least:
        raise ValueError(f"a {arch} green context needs at least {least} SMs in steps of {step}; "
                         f"the GPU has gpu_sms={gpu_sms!r}")
    return min(granted, largest)


def tpcs_to_sms(tpcs: int) -> int:
    """SMs in `tpcs` TPCs."""
    return tpcs * SMS_PER_TPC
