"""What crosses a process boundary about a tensor: its descriptor, never the tensor object itself.

The coordinator and Redis only ever see descriptors; the bytes travel over a transport backend.
Bytes are raw little-endian tensor storage, checked against the descriptor's length and CRC32 on
arrival, so a torn or misrouted transfer is an error, never a silent wrong answer.
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
    checksum: int = Field(ge=0, lt=1 << 32)
    """CRC32 of the raw bytes."""

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
    t = tensor.detach().to("cpu").contiguous().reshape(-1)  # 1-d first: a 0-d tensor cannot be re-viewed
    return memoryview(t.view(torch.uint8).numpy())


def describe(request_id: str, name: str, tensor: torch.Tensor) -> tuple[TensorDescriptor, memoryview]:
    raw = tensor_bytes(tensor)
    desc = TensorDescriptor(
        request_id=request_id,
        name=name,
        dtype=dtype_name(tensor.dtype),
        shape=tuple(tensor.shape),
        nbytes=raw.nbytes,
        checksum=crc32(raw),
    )
    return desc, raw


class WireError(ValueError):
    """Bytes that do not match their descriptor."""


def rebuild(desc: TensorDescriptor, raw: bytes | bytearray | memoryview) -> torch.Tensor:
    """Check bytes against the descriptor and view them as the described tensor (no copy if writable)."""
    if len(raw) != desc.nbytes:
        raise WireError(f"{desc.request_id}/{desc.name}: got {len(raw)} bytes, descriptor says {desc.nbytes}")
    crc = crc32(raw)
    if crc != desc.checksum:
        raise WireError(f"{desc.request_id}/{desc.name}: checksum {crc:#x} != descriptor {desc.checksum:#x}")
    writable = isinstance(raw, bytearray) or (isinstance(raw, memoryview) and not raw.readonly)
    buf = raw if writable else bytearray(raw)  # torch.frombuffer wants writable memory; copy only if not
    if desc.nbytes == 0:
        return torch.empty(desc.shape, dtype=_TORCH_DTYPES[desc.dtype])
    return torch.frombuffer(buf, dtype=torch.uint8).view(_TORCH_DTYPES[desc.dtype]).reshape(desc.shape)
