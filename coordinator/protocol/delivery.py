"""Sending a request's tensors to the next worker: with a deadline, and to another candidate if the chosen
one fails (it died, or hangs: a stopped process accepts a connection and then reads nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from coordinator.protocol.registry import WorkerStatus
from transport.base import EmbeddingSender
from transport.wire import TensorDescriptor

SEND_FLOOR_S = 2.0
"""Least time a transfer gets before its target counts as failed (the failure detector's own scale)."""
SEND_RATE_FLOOR_BPS = 100e6
"""Slowest transfer rate that still counts as working (a 1 GB KV cache gets 12 s)."""
MAX_TRIES = 3


def transfer_id(request_id: str, attempt: int) -> str:
    """The id a request's tensors travel under: its own id on the first attempt, one per re-run after that. A
    worker that drops an aborted attempt's tensors refuses that id for a while (transport/inbox.py); a re-run
    the coordinator started because it thought the worker dead (a heartbeat that lapsed on a loaded host) may
    come back to that same worker, and its tensors must not be refused with the old attempt's."""
    return request_id if attempt == 0 else f"{request_id}@{attempt}"


class DeliveryError(RuntimeError):
    """No candidate took the tensors; the message lists why each failed."""


def send_deadline_s(tensors: dict[str, torch.Tensor]) -> float:
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return SEND_FLOOR_S + size / SEND_RATE_FLOOR_BPS


async def deliver(sender: EmbeddingSender, candidates: list[WorkerStatus], request_id: str,
                  tensors: dict[str, torch.Tensor],
                  pick: Callable[[list[WorkerStatus]], WorkerStatus | None]) -> tuple[WorkerStatus, list[TensorDescriptor]]:
    """Send to `pick(candidates)`; on failure or timeout, to `pick` of the rest (at most MAX_TRIES)."""
    left, failures = list(candidates), []
    deadline = send_deadline_s(tensors)
    for _ in range(MAX_TRIES):
        target = pick(left)
        if target is None:
            break
        try:
            descs = await asyncio.wait_for(sender.send(target.info.transport_address, request_id, tensors), deadline)
            return target, descs
        except asyncio.TimeoutError:
            failures.append(f"{target.info.worker_id}: no answer within {deadline:.1f} s")
        except Exception as e:  # a refused connection, a reset, a refusal by the receiver
            failures.append(f"{target.info.worker_id}: {type(e).__name__}: {e}")
        left = [w for w in left if w.info.worker_id != target.info.worker_id]
    if not failures:
        raise DeliveryError("no live worker to send to")
    raise DeliveryError("; ".join(failures))
