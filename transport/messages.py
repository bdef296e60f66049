"""The control messages the ucx and nixl backends exchange beside the bytes (JSON, never pickle).

One typed class per message, dispatched by its `kind`. A frame is a 4-byte little-endian length and the
JSON, so a receiver can post a fixed-size buffer for messages whose size it cannot know in advance.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from transport.auth import Stamp
from transport.wire import TensorDescriptor

MAX_CONTROL = 1 << 16
"""Largest control message in bytes; a send with so many tensors that its offer is bigger is refused."""
_LEN = struct.Struct("<I")


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True)


class Offer(_Msg):
    """ucx: a sender announces one send; the tensors follow as tag messages `tag + 1 + i`. The descriptors
    carry no checksum yet (the sender computes it while the bytes move): the receiver verifies at recv()."""

    kind: Literal["offer"] = "offer"
    reply_to: str
    """The sender's UCX worker address (base64); the receiver keeps one endpoint per address."""
    tag: int = Field(ge=0, lt=1 << 64)
    descs: list[TensorDescriptor]
    stamp: Stamp | None = None
    """With a cluster secret: the HMAC over descs, tag and reply_to (transport/auth.py)."""


class Reply(_Msg):
    """ucx: the receiver's answer to an offer, sent as soon as it posted the receives (status as in
    local_frame: 0 accepted, 1 rejected with the reason, before any tensor moved)."""

    kind: Literal["reply"] = "reply"
    xid: int
    status: int
    text: str = ""


class Hello(_Msg):
    """nixl: a sender agent's first message to a receiver: its metadata, so the receiver can answer it."""

    kind: Literal["hello"] = "hello"
    metadata: str
    """base64 of nixl_agent.get_agent_metadata()."""
    stamp: Stamp | None = None
    """With a cluster secret: the HMAC over the metadata; without a good one the receiver grants nothing."""


class Grant(_Msg):
    """nixl: the part of its registered pool a receiver lets one sender WRITE into (or why it cannot)."""

    kind: Literal["grant"] = "grant"
    base: int
    """Address of the receiver's pool; block i starts at base + i * block."""
    block: int
    start: int
    """First block of the grant."""
    blocks: int
    error: str = ""
    max_request: int = 0
    """The receiver's max_request_bytes (0: not said), so the sender refuses a bigger send itself, with the
    reason: a one-sided WRITE gets no reply the receiver could refuse it in."""


class Written(_Msg):
    """nixl: sent with a WRITE (NIXL delivers it after the bytes): these tensors are at these pool blocks.
    The descriptors carry no checksum: the receiver verifies when the engine claims them."""

    kind: Literal["written"] = "written"
    descs: list[TensorDescriptor]
    starts: list[int]
    """First pool block of each tensor (zero-size tensors take none; their entry is ignored)."""
    stamp: Stamp | None = None
    """With a cluster secret: the HMAC over descs and starts; without a good one nothing is filed."""


class Credit(_Msg):
    """nixl: blocks of a sender's grant that the receiver is done with, as (first block, bytes) runs. An empty
    one is a keepalive: failing to deliver it tells the receiver the sender is gone."""

    kind: Literal["credit"] = "credit"
    runs: list[tuple[int, int]] = []


class Bye(_Msg):
    """nixl: a sender closing (its grant can be reused), or a receiver closing (stop writing to it)."""

    kind: Literal["bye"] = "bye"
    stamp: Stamp | None = None
    """From a sender, with a cluster secret: without a good one the receiver keeps the grant."""


Message = Annotated[Union[Offer, Reply, Hello, Grant, Written, Credit, Bye], Field(discriminator="kind")]
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
