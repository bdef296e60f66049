"""The policy contract: observe events, decide what is due, say when to ask again. No I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Arrival:
    """A request joined this encode worker's open micro-batch."""

    request_id: str


@dataclass(frozen=True)
class Release:
    """Release the `count` oldest queued requests onto the worker's stream as one micro-batch."""

    count: int


class BatchPolicy(Protocol):
    def observe(self, event: Arrival, now: float) -> None: ...

    def decide(self, now: float) -> list[Release]: ...

    def next_deadline(self, now: float) -> float | None:
        """When `decide` may next return something without a new event; None = only on events."""
        ...
