"""CUDA green contexts: SM partitions created up front, one stream per partition.

Where libsmctrl can re-mask a stream per kernel launch, a green context fixes its SM group when it
is created. So the encode worker pre-creates a few layouts (encoder SMs / prefill SMs, e.g. one per
split the policy can choose) and, per micro-batch, launches the encoder and the prefill on the streams
of the layout nearest to the policy's split. SM groups come in architecture steps (tpc_mask.py:
4/2 on Ampere and Ada, 8/8 on Hopper), so a partition can hold more or fewer SMs than asked;
`GreenPartition.sms` is what the driver granted.

Two backends:

- "driver": the CUDA driver API through ctypes (libcuda.so.1, driver 12.4+): cuDeviceGetDevResource,
  then cuDevSmResourceSplitByCount takes one group of the asked size off the device's SMs, then the
  next group off what remains, and so on; the last partition is the rest. The groups are DISJOINT.
  Each gets cuDevResourceGenerateDesc, cuGreenCtxCreate and cuGreenCtxStreamCreate (non-blocking).
  CUdevResource is held as an opaque 256-byte buffer; only `type` (offset 0) and `sm.smCount`
  (offset 96) are read, which is the layout of CUDA 12.4 to 13.x (4 + 92 bytes of padding before
  the union).
- "torch": ``torch.cuda.green_contexts.GreenContext`` (beta in torch 2.13; SUPPORTED is False in
  CPU builds). Each ``create(num_sms=...)`` splits its group off the WHOLE device, so two contexts
  are not guaranteed disjoint; partitions from it report ``disjoint=False`` and granted SMs only as
  computed from the architecture's rounding rule.

"auto" picks the driver backend when libcuda has the green-context symbols (disjoint groups are
what partitioning needs), else torch's.

Unverified on the CPU machine this was written on (no libcuda): every driver call, the struct offset
of smCount, the torch backend's ``Stream()``, and that torch kernels launched on a green-context
stream (via ``torch.cuda.ExternalStream``) stay inside its SMs. benchmarks/gpu/smpartition.py
exercises all of it and measures the slowdown a small partition causes.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

from native.availability import Availability, Unavailable, load_libcuda
from native.tpc_mask import round_sm_request

Backend = Literal["auto", "driver", "torch"]
_BACKENDS = ("auto", "driver", "torch")

_CU_DEV_RESOURCE_TYPE_SM = 1
_CU_GREEN_CTX_DEFAULT_STREAM = 0x1
_CU_STREAM_NON_BLOCKING = 0x1
_ATTR_SM_COUNT = 16
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_MIN_DRIVER = 12040
_DRIVER_SYMBOLS = ("cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
                   "cuGreenCtxCreate", "cuGreenCtxStreamCreate", "cuGreenCtxDestroy")


class _DevResource(ctypes.Structure):
    """CUdevResource as an opaque buffer larger than any CUDA 12/13 layout (144 bytes)."""

    _fields_ = [("type", ctypes.c_int32), ("_internal_padding", ctypes.c_ubyte * 92),
                ("sm_count", ctypes.c_uint32), ("_rest", ctypes.c_uint64 * 20)]


@dataclass(frozen=True)
class GreenPartition:
    """One SM partition and the stream whose kernels run only there."""

    sms: int | None
    """SMs the driver granted; torch backend: the rounding rule's answer, None for an unknown arch."""
    stream: int
    """The CUstream handle; in torch: ``torch.cuda.ExternalStream(stream, device=...)``."""
    disjoint: bool
    """True when no other partition of the same layout shares its SMs (driver backend)."""


def _arch(major: int, minor: int) -> str | None:
    if major == 8:
        return "ada" if minor >= 9 else "ampere"
    if major >= 9:
        return "hopper"
    return None


class GreenContexts:
    """Creates green-context partitions on one GPU and owns them until close().

    Nothing is loaded at construction; available() (or the first partition) does it and says why
    it cannot. Use as a context manager, or call close(): contexts and streams are destroyed then.
    """

    def __init__(self, device: int = 0, backend: Backend = "auto", *, driver_path: str | None = None) -> None:
        """`driver_path`: a libcuda to load instead of libcuda.so.1 (tests stand in a fake for it)."""
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got backend={backend!r}")
        self.device = device
        self._asked = backend
        self._driver_path = driver_path
        self._lock = threading.Lock()
        self._availability: Availability | None = None
        self._backend: str | None = None
        self._cuda: ctypes.CDLL | None = None
        self._cu_device = ctypes.c_int(0)
        self._owned: list[tuple[Any, Any]] = []
        """(green context, stream) pairs to destroy; torch objects or driver handles."""

    def available(self) -> Availability:
        """Whether partitions can be created here, and why not. Never raises."""
        with self._lock:
            if self._availability is None:
                reasons = []
                order = ("driver", "torch") if self._asked == "auto" else (self._asked,)
                for name in order:
                    try:
                        reason = self._open_driver() if name == "driver" else self._open_torch()
                    except Unavailable as e:
                        reasons.append(f"{name}: {str(e).removeprefix('unsupported: ')}")
                        continue
                    self._backend = name
                    self._availability = Availability(True, reason)
                    break
                else:
                    self._availability = Availability(False, "unsupported: " + "; ".join(reasons))
            return self._availability

    @property
    def backend(self) -> str | None:
        """The backend in use ("driver" or "torch") once available() succeeded, else None."""
        self.available()
        return self._backend

    def _open_driver(self) -> str:
        cuda = load_libcuda(self._driver_path)
        missing = [s for s in _DRIVER_SYMBOLS if not hasattr(cuda, s)]
        version = ctypes.c_int(0)
        cuda.cuDriverGetVersion(ctypes.byref(version))
        if missing or version.value < _MIN_DRIVER:
            raise Unavailable(f"unsupported: CUDA driver {version.value} lacks green contexts (needs {_MIN_DRIVER}+; "
                              f"missing {', '.join(missing) or 'nothing'})")
        self._cuda = cuda
        self._check(cuda.cuInit(0), "cuInit")
        self._check(cuda.cuDeviceGet(ctypes.byref(self._cu_device), self.device), f"cuDeviceGet({self.device})")
        return f"green contexts through the CUDA driver {version.value} (disjoint partitions)"

    def _open_torch(self) -> str:
        try:
            import torch
            from torch.cuda import green_contexts
        except ImportError as e:
            raise Unavailable(f"unsupported: torch has no green-context module ({e})") from e
        if not torch.cuda.is_available():
            raise Unavailable(f"unsupported: torch {torch.__version__} sees no CUDA GPU")
        if not getattr(green_contexts, "SUPPORTED", False):
            raise Unavailable(f"unsupported: torch {torch.__version__} was built without green contexts")
        return f"green contexts through torch {torch.__version__} (partitions may overlap)"

    def _check(self, rc: int, what: str) -> None:
        if rc == 0:
            return
        name = ctypes.c_char_p()
        assert self._cuda is not None
        self._cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise Unavailable(f"unsupported: {what} failed: {rc} {name.value.decode() if name.value else ''}".rstrip())

    def _attr(self, attr: int) -> int:
        assert self._cuda is not None
        value = ctypes.c_int(0)
        self._check(self._cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, self._cu_device),
                    f"cuDeviceGetAttribute({attr})")
        return value.value

    def _ready(self) -> str:
        state = self.available()
        if not state.ok or self._backend is None:
            raise Unavailable(state.reason)
        return self._backend

    def device_sms(self) -> int:
        """SMs on the device."""
        if self._ready() == "driver":
            return self._attr(_ATTR_SM_COUNT)
        import torch

        return torch.cuda.get_device_properties(self.device).multi_processor_count

    def partition(self, sm_counts: Sequence[int], *, rest: bool = True) -> tuple[GreenPartition, ...]:
        """Partitions of (about) `sm_counts` SMs, in order, plus one holding every SM left if `rest`.

        Raises Unavailable if green contexts cannot run here, ValueError if the GPU cannot hold the groups.
        """
        if any(n < 1 for n in sm_counts) or not (sm_counts or rest):
            raise ValueError(f"sm_counts must be positive and something must be asked for, got {list(sm_counts)!r}")
        if self._ready() == "driver":
            return self._partition_driver(sm_counts, rest)
        return self._partition_torch(sm_counts, rest)

    def split(self, encoder_sms: int) -> tuple[GreenPartition, GreenPartition]:
        """An (encoder, prefill) layout: about `encoder_sms` SMs for the encoder, the rest for prefill."""
        encoder, prefill = self.partition([encoder_sms], rest=True)
        return encoder, prefill

    def _partition_driver(self, sm_counts: Sequence[int], rest: bool) -> tuple[GreenPartition, ...]:
        cuda = self._cuda
        assert cuda is not None
        source = _DevResource()
        self._check(cuda.cuDeviceGetDevResource(self._cu_device, ctypes.byref(source), _CU_DEV_RESOURCE_TYPE_SM),
                    "cuDeviceGetDevResource")
        groups: list[_DevResource] = []
        for n in sm_counts:
            group, remaining, count = _DevResource(), _DevResource(), ctypes.c_uint(1)
            self._check(cuda.cuDevSmResourceSplitByCount(ctypes.byref(group), ctypes.byref(count), ctypes.byref(source),
                                                         ctypes.byref(remaining), 0, n),
                        f"cuDevSmResourceSplitByCount(minCount={n})")
            if count.value != 1 or group.sm_count == 0:
                raise ValueError(f"the GPU has no group of {n} SMs left (asked {list(sm_counts)}, "
                                 f"{source.sm_count} SMs were left)")
            groups.append(group)
            source = remaining
        if rest:
            if source.sm_count == 0:
                raise ValueError(f"no SMs are left for the rest after {list(sm_counts)}")
            groups.append(source)
        return tuple(self._create_driver(g) for g in groups)

    def _create_driver(self, group: _DevResource) -> GreenPartition:
        cuda = self._cuda
        assert cuda is not None
        desc, ctx, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self._check(cuda.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(group), 1),
                    "cuDevResourceGenerateDesc")
        self._check(cuda.cuGreenCtxCreate(ctypes.byref(ctx), desc, self._cu_device, _CU_GREEN_CTX_DEFAULT_STREAM),
                    "cuGreenCtxCreate")
        rc = cuda.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, _CU_STREAM_NON_BLOCKING, 0)
        if rc != 0:
            cuda.cuGreenCtxDestroy(ctx)
            self._check(rc, "cuGreenCtxStreamCreate")
        self._owned.append((ctx, stream))
        return GreenPartition(sms=group.sm_count, stream=stream.value or 0, disjoint=True)

    def _partition_torch(self, sm_counts: Sequence[int], rest: bool) -> tuple[GreenPartition, ...]:
        import torch
        from torch.cuda.green_contexts import GreenContext

        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        arch = _arch(*torch.cuda.get_device_capability(self.device))
        granted = [round_sm_request(n, arch, total) if arch else None for n in sm_counts]  # type: ignore[arg-type]
        asks = list(sm_counts)
        if rest:
            left = total - sum(g if g is not None else n for g, n in zip(granted, sm_counts, strict=True))
            if left < 1:
                raise ValueError(f"no SMs are left for the rest after {asks} on a {total}-SM GPU")
            asks.append(left)
            granted.append(round_sm_request(left, arch, total) if arch else None)  # type: ignore[arg-type]
        out = []
        for n, g in zip(asks, granted, strict=True):
            ctx = GreenContext.create(num_sms=n, device_id=self.device)
            stream = ctx.Stream()
            self._owned.append((ctx, stream))
            out.append(GreenPartition(sms=g, stream=int(stream.cuda_stream), disjoint=False))
        return tuple(out)

    def close(self) -> None:
        """Destroy every context and stream this object created (torch's are released to torch)."""
        owned, self._owned = self._owned, []
        if self._backend == "driver" and self._cuda is not None:
            destroy = getattr(self._cuda, "cuStreamDestroy_v2", None) or self._cuda.cuStreamDestroy
            for ctx, stream in reversed(owned):
                destroy(stream)
                self._cuda.cuGreenCtxDestroy(ctx)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe(device: int = 0, backend: Backend = "auto") -> Availability:
    """Can this process create green-context partitions? Never raises."""
    return GreenContexts(device, backend).available()
