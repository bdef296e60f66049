"""The control messages the ucx and nixl backends exchange beside the bytes (JSON, never pickle).

One typed class per message, dispatched by its `kind`. A frame is a 4-byte little-endian length and the
JSON, so a receiver can post a fixed-size buffer for messages whose size it cannot know in advance.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from transport.wire import TensorDescriptor

MAX_CONTROL = 1 << 16
"""Largest control message in bytes; a send with so many tensors that its offer is bigger is refused."""
_LEN = struct.Struct("<I")


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True)


class Offer(_Msg):
    """ucx: a sender announces one send; the tensors follow as tag messages `tag + 1 + i`."""

    kind: Literal["offer"] = "offer"
    reply_to: str
    """The sender's UCX worker address (base64); the receiver keeps one endpoint per address."""
    tag: int = Field(ge=0, lt=1 << 64)
    descs: list[TensorDescriptor]


class Reply(_Msg):
    """ucx and nixl: the receiver's verdict on one send (status as in local_frame: 0 ok, 1 rejected)."""

    kind: Literal["reply"] = "reply"
    xid: int
    status: int
    text: str = ""


class Hello(_Msg):
    """nixl: the first message from a sender agent: its metadata and pool layout, so the receiver can READ
    from its pool and answer it."""

    kind: Literal["hello"] = "hello"
    metadata: str
    """base64 of nixl_agent.get_agent_metadata()."""
    base: int
    block: int
    blocks: int


class Posted(_Msg):
    """nixl: the tensors of one send are in the sender's registered pool at these blocks; READ them."""

    kind: Literal["posted"] = "posted"
    xid: int
    descs: list[TensorDescriptor]
    blocks: list[int]


Message = Annotated[Union[Offer, Reply, Hello, Posted], Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


class ControlError(ValueError):
    """A control message that cannot be parsed; the text says what was wrong."""


def pack(msg: _Msg) -> bytes:
    body = msg.model_dump_json().encode()
    if len(body) + _LEN.size > MAX_CONTROL:
        raise ControlError(f"{msg.kind} message of {len(body)} bytes exceeds {MAX_CONTROL}; send fewer tensors at once")
    return _LEN.pack(len(body)) + body


def unpack(frame: bytes | bytearray | memoryview) -> Message:
    if len(frame) < _LEN.size:
        raise ControlError(f"control frame of {len(frame)} bytes is shorter than its length prefix")
    (n,) = _LEN.unpack_from(frame)
    if n > len(frame) - _LEN.size:
        raise ControlError(f"control frame says {n} bytes but holds {len(frame) - _LEN.size}")
    try:
        return _ADAPTER.validate_json(bytes(frame[_LEN.size : _LEN.size + n]))
    except ValidationError as e:
        first = e.errors()[0]["msg"]
        raise ControlError(f"invalid control message: {e.error_count()} errors, first: {first}") from None
