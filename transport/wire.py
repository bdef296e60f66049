"""What crosses a process boundary about a tensor: its descriptor, never the tensor object itself.

The coordinator and Redis only ever see descriptors; the bytes travel over a transport backend.
Bytes are raw little-endian tensor storage, checked against the descriptor's length and CRC32 before
the engine gets them, so a torn or misrouted transfer is an error, never a silent wrong answer. A sender
may be configured not to checksum (`checksum=None`): then only dtype, shape and length are checked.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from transport.checksum import crc32

DType = Literal["float32", "float16", "bfloat16", "int64", "int32", "uint8"]

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
_DTYPE_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}
_MAX_ELEMENTS = 1 << 48


class TensorDescriptor(BaseModel):
    """Names one tensor of one request; enough to validate and rebuild it from raw bytes."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    name: str
    """Role of the tensor within the request, e.g. "image_embeds" or "kv"."""
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int = Field(ge=0)
    checksum: int | None = Field(None, ge=0, lt=1 << 32)
    """CRC32 of the raw bytes; None when the sender was set not to checksum (its `checksum="none"` option)."""

    @model_validator(mode="after")
    def _size_matches_shape(self) -> "TensorDescriptor":
        if any(d < 0 for d in self.shape):
            raise ValueError(f"{self.request_id}/{self.name}: negative dimension in shape {self.shape}")
        if math.prod(d for d in self.shape if d) > _MAX_ELEMENTS:  # zero-size shapes can hide absurd dims
            raise ValueError(f"{self.request_id}/{self.name}: shape {self.shape} is too large to describe")
        expected = math.prod(self.shape) * _TORCH_DTYPES[self.dtype].itemsize
        if expected != self.nbytes:
            raise ValueError(f"{self.request_id}/{self.name}: shape {self.shape} of {self.dtype} is "
                             f"{expected} bytes, descriptor says {self.nbytes}")
        return self


def dtype_name(dtype: torch.dtype) -> DType:
    try:
        return _DTYPE_NAMES[dtype]  # type: ignore[return-value]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot cross the wire; use one of {sorted(_TORCH_DTYPES)}") from None


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """Raw storage of a CPU tensor, without a copy when it is already contiguous."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.detach().to("cpu").contiguous()
    t = tensor.detach().reshape(-1)  # 1-d first: a 0-d tensor cannot be re-viewed
    return memoryview(t.view(torch.uint8).numpy())


def describe(request_id: str, name: str, tensor: torch.Tensor, *, checksum: bool = True
             ) -> tuple[TensorDescriptor, memoryview]:
    """The descriptor and raw bytes of a tensor; `checksum=False` leaves the CRC32 out (the fast backends
    compute it while the bytes move and fill it in with `model_copy(update={"checksum": ...})`)."""
    raw = tensor_bytes(tensor)
    # Built from the tensor itself, so it is consistent: skip the validation a received descriptor gets.
    desc = TensorDescriptor.model_construct(
        request_id=request_id,
        name=name,
        dtype=dtype_name(tensor.dtype),
        shape=tuple(tensor.shape),
        nbytes=raw.nbytes,
        checksum=crc32(raw) if checksum else None,
    )
    return desc, raw


class WireError(ValueError):
    """Bytes that do not match their descriptor."""


def same_tensor(a: TensorDescriptor, b: TensorDescriptor) -> bool:
    """Whether two descriptors name the same tensor layout (everything but the checksum)."""
    return (a.request_id, a.name, a.dtype, a.shape, a.nbytes) == (b.request_id, b.name, b.dtype, b.shape, b.nbytes)


def verify(desc: TensorDescriptor, raw: bytes | bytearray | memoryview) -> None:
    """Raise WireError unless the bytes have the descriptor's length and (if it has one) its CRC32."""
    if len(raw) != desc.nbytes:
        raise WireError(f"{desc.request_id}/{desc.name}: got {len(raw)} bytes, descriptor says {desc.nbytes}")
    if desc.checksum is not None:
        crc = crc32(raw)
        if crc != desc.checksum:
            raise WireError(f"{desc.request_id}/{desc.name}: checksum {crc:#x} != descriptor {desc.checksum:#x}")


def rebuild(desc: TensorDescriptor, raw: bytes | bytearray | memoryview, *, check: bool = True) -> torch.Tensor:
    """View bytes as the described tensor (no copy if writable), after `verify` unless `check=False` (for
    receivers that verify later, when the engine claims the tensor with the descriptor it was sent)."""
    if check:
        verify(desc, raw)
    elif len(raw) != desc.nbytes:
        raise WireError(f"{desc.request_id}/{desc.name}: got {len(raw)} bytes, descriptor says {desc.nbytes}")
    writable = isinstance(raw, bytearray) or (isinstance(raw, memoryview) and not raw.readonly)
    buf = raw if writable else bytearray(raw)  # torch.frombuffer wants writable memory; copy only if not
    if desc.nbytes == 0:
        return torch.empty(desc.shape, dtype=_TORCH_DTYPES[desc.dtype])
    return torch.frombuffer(buf, dtype=torch.uint8).view(_TORCH_DTYPES[desc.dtype]).reshape(desc.shape)
