"""What a receiver refuses, how much it keeps for requests nobody has claimed yet, and the counts of both.

Tensors arrive before the receiving worker knows of their request (the sender returns the descriptors,
which then travel through Redis), so a receiver cannot wait for an invitation; it bounds instead what an
arrival may cost: unclaimed tensors are kept at most `ttl_s`, at most `max_request_bytes` per request and
`max_unclaimed_bytes` in all (arrivals in progress included), and a request this receiver was told to
discard (an aborted one) gets nothing more. A refused transfer moves no payload where the protocol allows
(tcp, local, ucx: the sender gets the reason as a TransportError) and is counted in `ReceiverStats`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from transport.base import TransportError

Reason = Literal["bad_mac", "stale", "replay", "misaddressed", "unexpected", "over_cap"]


class Refused(TransportError):
    """A transfer the receiver will not take; `reason` names the counter it increments."""

    def __init__(self, reason: Reason, text: str) -> None:
        super().__init__(text)
        self.reason: Reason = reason


@dataclass(frozen=True)
class Limits:
    """How much unclaimed memory one receiver may hold, and for how long."""

    ttl_s: float = 60.0
    """Seconds after its last arrival that an unclaimed request is dropped (the worker claims within its
    recv timeout, 30 s, or the request has failed)."""
    max_unclaimed_bytes: int = 1 << 30
    """All tensors arrived (or arriving) and not yet claimed, in bytes; beyond it transfers are refused."""
    max_request_bytes: int = 512 << 20
    """Unclaimed bytes of one request; beyond it its transfers are refused."""

    def __post_init__(self) -> None:
        if self.ttl_s <= 0 or self.max_unclaimed_bytes <= 0 or self.max_request_bytes <= 0:
            raise ValueError(f"receiver limits must be positive, got ttl_s={self.ttl_s}, max_unclaimed_bytes="
                             f"{self.max_unclaimed_bytes}, max_request_bytes={self.max_request_bytes}")


@dataclass
class ReceiverStats:
    """Counters of one receiver since it started (a worker reports them as metrics), and one gauge."""

    accepted: int = 0
    """Transfers taken in."""
    refused_bad_mac: int = 0
    """No or a wrong authentication tag: not of this cluster (or a wrong secret)."""
    refused_stale: int = 0
    """Issued too long ago (or too far ahead): a delayed, replayed or clock-skewed transfer."""
    refused_replay: int = 0
    """A tag already used."""
    refused_misaddressed: int = 0
    """Genuine but for another receiver (a stale address)."""
    refused_unexpected: int = 0
    """For a request this receiver discarded, or outside what the sender was granted (nixl)."""
    refused_over_cap: int = 0
    """Beyond `max_request_bytes` or `max_unclaimed_bytes`."""
    expired: int = 0
    """Requests dropped unclaimed after `ttl_s`."""
    unclaimed_bytes: int = 0
    """Bytes arrived or arriving and not yet claimed, now."""

    def count(self, reason: Reason) -> None:
        name = f"refused_{reason}"
        setattr(self, name, getattr(self, name) + 1)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
