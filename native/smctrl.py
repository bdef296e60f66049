"""libsmctrl per-stream TPC masks (SM partitioning on one GPU), through the C shim smctrl_shim.c.

libsmctrl is not vendored: the user builds it from its public repository (native/README.md) and
points TIERSERVE_LIBSMCTRL (or `lib_path`) at the ``libsmctrl.so``. On first use the shim is
compiled with gcc into the per-user cache (native/cbuild.py) and loaded with ctypes; the shim
dlopen()s libsmctrl. Importing this module does nothing of that and never raises; `available()`
says why partitioning cannot run here (no CUDA driver, no libsmctrl, no gcc, a load error), and the
encode worker then runs unpartitioned.

Masks follow libsmctrl: bit i SET means TPC i may NOT run the stream's kernels; 0 means every TPC
(native/tpc_mask.py builds them). A mask applies to kernels launched on that stream after the call,
and reconfiguring costs a few stores, so the encode worker sets one pair of masks per micro-batch.

Not verifiable on a CPU machine: the calls into a real libsmctrl (tests use a stand-in library that
records its arguments). benchmarks/gpu/smpartition.py exercises them on a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from native import envs
from native.availability import Availability, Unavailable, load_libcuda
from native.cbuild import build_shared
from native.tpc_mask import masks_for, needs_ext, to_words

if TYPE_CHECKING:
    from coordinator.policies.sm_partition import TPCSplit

__all__ = ["SHIM_SOURCE", "Availability", "SMControlError", "SMController", "load_shim", "probe"]

SHIM_SOURCE = Path(__file__).with_name("smctrl_shim.c")
_ERRLEN = 1024


class SMControlError(RuntimeError):
    """A libsmctrl call could not be made or failed; the message says why."""


def load_shim(cache_dir: Path | None = None) -> ctypes.CDLL:
    """Build (once per source version) and load the shim, with its C signatures declared."""
    shim = ctypes.CDLL(str(build_shared(SHIM_SOURCE, cache_dir, libs=("-ldl",))))
    err = ctypes.c_char_p
    shim.ts_smctrl_open.argtypes = [ctypes.c_char_p, err, ctypes.c_int]
    shim.ts_smctrl_open.restype = ctypes.c_int
    shim.ts_smctrl_has_ext.argtypes = []
    shim.ts_smctrl_has_ext.restype = ctypes.c_int
    shim.ts_smctrl_num_tpcs.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint32), err, ctypes.c_int]
    shim.ts_smctrl_num_tpcs.restype = ctypes.c_int
    shim.ts_smctrl_set_stream_mask.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, err, ctypes.c_int]
    shim.ts_smctrl_set_stream_mask.restype = ctypes.c_int
    shim.ts_smctrl_close.argtypes = []
    shim.ts_smctrl_close.restype = None
    return shim


class SMController:
    """Sets libsmctrl TPC masks on CUDA streams. Loads lazily; one libsmctrl per process.

    The first call that needs the library checks, in order: the CUDA driver (libcuda) loads; a
    libsmctrl path is known (`lib_path`, else TIERSERVE_LIBSMCTRL, else a ``libsmctrl`` on the
    loader's path); gcc builds the shim; the shim opens libsmctrl. The outcome is kept, so later
    calls cost nothing. `check_driver=False` skips the first step; it exists for tests that stand
    in a fake libsmctrl for the GPU-only real one.
    """

    def __init__(self, lib_path: str | os.PathLike[str] | None = None, *, cache_dir: Path | None = None,
                 check_driver: bool = True) -> None:
        self._lib_path = os.fspath(lib_path) if lib_path is not None else None
        self._cache_dir = cache_dir
        self._check_driver = check_driver
        self._lock = threading.Lock()
        self._shim: ctypes.CDLL | None = None
        self._availability: Availability | None = None

    def available(self) -> Availability:
        """Whether masks can be set in this process, and why not. Never raises."""
        with self._lock:
            if self._availability is None:
                try:
                    self._shim, reason = self._open()
                    self._availability = Availability(True, reason)
                except Unavailable as e:
                    self._availability = Availability(False, str(e))
            return self._availability

    def _open(self) -> tuple[ctypes.CDLL, str]:
        if self._check_driver:
            load_libcuda()
        path = self._lib_path or envs.libsmctrl_path() or ctypes.util.find_library("smctrl")
        if not path:
            raise Unavailable("unsupported: libsmctrl not found; build it (native/README.md) and set "
                              "TIERSERVE_LIBSMCTRL to the libsmctrl.so")
        if os.sep in path and not os.path.isfile(path):
            raise Unavailable(f"unsupported: libsmctrl not found at {path}; build it (native/README.md) and set "
                              "TIERSERVE_LIBSMCTRL to the libsmctrl.so")
        shim = load_shim(self._cache_dir)
        err = ctypes.create_string_buffer(_ERRLEN)
        if shim.ts_smctrl_open(path.encode(), err, _ERRLEN) != 0:
            raise Unavailable(f"unsupported: libsmctrl failed to load: {err.value.decode(errors='replace')}")
        ext = "with" if shim.ts_smctrl_has_ext() == 1 else "without"
        return shim, f"libsmctrl loaded from {path} ({ext} the 128-bit _ext API)"

    def _ready(self) -> ctypes.CDLL:
        state = self.available()
        if not state.ok or self._shim is None:
            raise SMControlError(f"SM partitioning is unavailable: {state.reason}")
        return self._shim

    @property
    def has_ext(self) -> bool:
        """Whether the loaded libsmctrl takes 128-bit masks (needed above 64 TPCs)."""
        return self._ready().ts_smctrl_has_ext() == 1

    def num_tpcs(self, device: int = 0) -> int:
        """TPCs on CUDA device `device`, as libsmctrl counts them."""
        shim = self._ready()
        out = ctypes.c_uint32()
        err = ctypes.create_string_buffer(_ERRLEN)
        if shim.ts_smctrl_num_tpcs(device, ctypes.byref(out), err, _ERRLEN) != 0:
            raise SMControlError(err.value.decode(errors="replace"))
        return out.value

    def apply(self, stream_handle: int, mask: int, total_tpcs: int) -> None:
        """Set `stream_handle`'s (a cudaStream_t as an int, e.g. torch's ``stream.cuda_stream``) TPC
        mask. `mask` is a disable mask over `total_tpcs` TPCs; 0 lets the stream use every TPC again."""
        shim = self._ready()
        lo, hi = to_words(mask, total_tpcs)
        if needs_ext(total_tpcs) and not self.has_ext:
            raise SMControlError(f"the GPU has total_tpcs={total_tpcs} (> 64) but this libsmctrl has no "
                                 "libsmctrl_set_stream_mask_ext; its 64-bit call cannot address TPCs 64 and up "
                                 "(build a newer libsmctrl)")
        err = ctypes.create_string_buffer(_ERRLEN)
        if shim.ts_smctrl_set_stream_mask(ctypes.c_void_p(stream_handle), lo, hi, err, _ERRLEN) != 0:
            raise SMControlError(err.value.decode(errors="replace"))

    def apply_split(self, split: TPCSplit, total_tpcs: int, encoder_stream: int, prefill_stream: int) -> None:
        """Masks for one micro-batch: the encoder on TPCs [0, e), prefill on the next p (masks_for).

        "none" clears both masks. A side given 0 TPCs has no work this micro-batch and its stream is
        left as it was, since a mask disabling every TPC must never see a launch.
        """
        encoder_mask, prefill_mask = masks_for(split, total_tpcs)
        if split.mode == "none" or split.encoder_tpcs > 0:
            self.apply(encoder_stream, encoder_mask, total_tpcs)
        if split.mode == "none" or split.prefill_tpcs > 0:
            self.apply(prefill_stream, prefill_mask, total_tpcs)


def probe(lib_path: str | None = None) -> Availability:
    """Can this process partition SMs with libsmctrl? Never raises; the reason says what is missing."""
    return SMController(lib_path).available()
