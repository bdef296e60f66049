"""Speed-controlled partial offload (EAServe): route each prefill to the local or a remote worker.

s in [0, 1] is the share of prefills that go to the prefill worker co-located on the encode GPU
("local"); the rest go to remote prefill/combined workers on datacenter GPUs ("remote").

The choice is deterministic, not random: with s = p/q as an exact fraction, after n decisions the
router has sent L(n) = floor(n*s + 1/2) of them local (a Bresenham line). So the first k decisions
are never more than half a request off k*s, and ANY run of W consecutive decisions sends
L(n+W) - L(n) in {floor(W*s), ceil(W*s)} local: within one request of W*s, i.e. within 1/W
(0.01 for W=100) of s. Random routing with s=0.3 misses +-0.05 over a given 100 requests 23% of
the time; this never does.

Fallback (one side down or saturated): the request goes to the side that can take it, and the
schedule above is NOT advanced. Only decisions where both sides were available count, so when
both come back the router continues its line exactly where it left off: no catch-up burst towards
the side that was down (which would pile work onto a worker that just recovered), and every
window of both-available decisions still meets the bound. The cost is that an outage lowers the
realised share of the window it falls in; `realised_share` reports that truthfully.

`set_share` restarts the line from zero with the new s, so every window that starts after the
change meets the bound at once, and a window straddling it is within 1.5 requests of the blend
of the two shares.

No clock is needed: the decision depends only on how many prefills were routed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Side = Literal["local", "remote"]

_MAX_DENOMINATOR = 1_000_000
"""s is held as the nearest fraction with at most this denominator: an error under 1e-6 per request."""


@dataclass(frozen=True)
class OffloadCounts:
    """Totals since construction, for metrics."""

    local: int
    """Prefills routed local when both sides were available (the s-controlled ones)."""
    remote: int
    """Prefills routed remote when both sides were available."""
    fallback_local: int
    """Prefills sent local because no remote worker could take them."""
    fallback_remote: int
    """Prefills sent remote because the local worker could not take them."""
    rejected: int
    """route() calls that returned None: neither side could take the prefill."""


def _exact_share(s: float) -> Fraction:
    if not 0.0 <= s <= 1.0:
        raise ValueError(f"offload share s must be in [0, 1], got s={s!r}")
    return Fraction(s).limit_denominator(_MAX_DENOMINATOR)


class OffloadRouter:
    """Route each prefill local (share s) or remote, deterministically; see the module docstring."""

    def __init__(self, s: float, window: int = 100) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 request, got window={window!r}")
        self.window = window
        self._share = _exact_share(s)
        self._phase = 0
        """Both-available decisions since the last set_share, modulo the denominator of s."""
        self._recent: deque[bool] = deque(maxlen=window)
        """Whether each of the last `window` routed prefills (fallbacks included) went local."""
        self._recent_local = 0
        self._local = self._remote = 0
        self._fallback_local = self._fallback_remote = self._rejected = 0

    @property
    def share(self) -> float:
        """The target s (as held: the nearest fraction with denominator <= 1e6)."""
        return float(self._share)

    def set_share(self, s: float) -> None:
        """Change s at run time (planner, admin endpoint); the schedule restarts from the next prefill,
        and `realised_share` from then on reports the new s's decisions only."""
        share = _exact_share(s)
        if share != self._share:
            self._share = share
            self._phase = 0
            self._recent.clear()
            self._recent_local = 0

    def route(self, local_available: bool, remote_available: bool) -> Side | None:
        """Where the next prefill goes; None if neither side can take it (the caller queues or rejects)."""
        if local_available and remote_available:
            side: Side = "local" if self._next_is_local() else "remote"
            if side == "local":
                self._local += 1
            else:
                self._remote += 1
        elif local_available:
            side = "local"
            self._fallback_local += 1
        elif remote_available:
            side = "remote"
            self._fallback_remote += 1
        else:
            self._rejected += 1
            return None
        self._record(side == "local")
        return side

    def route_by_load(self, local_loads: Sequence[int], remote_loads: Sequence[int],
                      saturation_load: int | None) -> Side | None:
        """`route` for sides given as their workers' loads (empty: no live worker there). A side is
        saturated when every worker on it holds >= `saturation_load` requests; it falls back to the other
        side only while that one is not saturated too (when both are, s holds: queueing is the engines'
        business, and sending everything one way would only move the queue)."""
        def room(loads: Sequence[int]) -> bool:
            return saturation_load is None or any(n < saturation_load for n in loads)

        local, remote = bool(local_loads), bool(remote_loads)
        if local and remote and room(local_loads) != room(remote_loads):
            local, remote = room(local_loads), room(remote_loads)
        return self.route(local, remote)

    def continue_after(self, decisions: int) -> None:
        """Continue the line as if `decisions` both-available prefills had been routed since s was set (a
        router that served earlier requests; counts and realised_share are left as they are)."""
        if decisions < 0:
            raise ValueError(f"decisions must be >= 0, got decisions={decisions!r}")
        self._phase = (self._phase + decisions) % self._share.denominator

    def _next_is_local(self) -> bool:
        p, q = self._share.numerator, self._share.denominator
        n = self._phase
        # L(n) = floor(n*p/q + 1/2), in integers; L(q) = p, so the pattern repeats every q decisions.
        local = (2 * p * (n + 1) + q) // (2 * q) > (2 * p * n + q) // (2 * q)
        self._phase = (n + 1) % q
        return local

    def _record(self, local: bool) -> None:
        if len(self._recent) == self.window:
            self._recent_local -= self._recent[0]
        self._recent.append(local)
        self._recent_local += local

    @property
    def realised_share(self) -> float | None:
        """Share of the last `window` routed prefills since s last changed (fallbacks included) that went
        local; None before any."""
        if not self._recent:
            return None
        return self._recent_local / len(self._recent)

    @property
    def counts(self) -> OffloadCounts:
        return OffloadCounts(self._local, self._remote, self._fallback_local, self._fallback_remote,
                             self._rejected)
