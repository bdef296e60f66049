"""The transport interface: embeddings and KV caches from one worker to another.

A receiver listens at an address that its worker publishes in the Redis registry; a sender pushes
named tensors of one request to that address and returns their descriptors, which travel on the
control plane (Redis streams) to the receiving worker, which then awaits the matching tensors.
Backends (local, tcp, ucx, nixl: see transport/README.md) implement these two classes.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import torch

from transport.wire import TensorDescriptor

if TYPE_CHECKING:
    from transport.admission import ReceiverStats


class TransportError(RuntimeError):
    """A transfer that could not be completed; the message says which peer and why."""


class EmbeddingSender(abc.ABC):
    @abc.abstractmethod
    async def send(self, peer: str, request_id: str, tensors: dict[str, torch.Tensor]) -> list[TensorDescriptor]:
        """Deliver `tensors` to the receiver at `peer`; returns once the bytes are in the receiver's memory.

        local and tcp verify length and CRC32 before that; ucx and nixl when recv() claims the tensors
        with the returned descriptors. Either way a damaged tensor never reaches the engine."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class EmbeddingReceiver(abc.ABC):
    @property
    @abc.abstractmethod
    def address(self) -> str:
        """Where senders reach this receiver; published in the worker registry."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def recv(self, descriptors: list[TensorDescriptor], timeout: float = 30.0) -> dict[str, torch.Tensor]:
        """Wait for the tensors named by `descriptors` and hand them over (each is delivered once)."""

    @abc.abstractmethod
    async def discard(self, request_id: str) -> None:
        """Drop whatever arrived for an aborted request; later transfers for it are refused (for a while)."""

    @abc.abstractmethod
    def stats(self) -> "ReceiverStats":
        """A snapshot of what this receiver accepted, refused (by reason) and holds unclaimed."""

    @abc.abstractmethod
    async def close(self) -> None: ...
