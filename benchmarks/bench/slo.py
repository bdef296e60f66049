"""The SLO a request must meet to count towards goodput: `--goodput ttft:MS tpot:MS [e2el:MS]` (units allowed).

A request is good only if it completed and meets every given target (DESIGN "Words": goodput counts
requests with TTFT <= T_f AND TPOT <= T_p). TTFT and TPOT are both required because either alone
rewards a system for starving the other phase; e2el (end-to-end latency) is an optional extra cap.
A request with a single output token has no TPOT, and so meets any TPOT target.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.durations import DurationError, parse_targets

KEYS = ("ttft", "tpot", "e2el")


class SLOError(ValueError):
    """An --goodput string that cannot be a target; the message shows the accepted form."""


class SLO(BaseModel):
    """Latency targets in milliseconds."""

    model_config = ConfigDict(frozen=True)

    ttft_ms: float = Field(gt=0)
    """Most time from sending the request to its first content token."""
    tpot_ms: float = Field(gt=0)
    """Most mean time per output token after the first: (E2E - TTFT) / (output tokens - 1)."""
    e2el_ms: float | None = Field(None, gt=0)
    """Optional cap on the time from sending to the end of the stream."""

    def met(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None) -> bool:
        if ttft_s is None or e2e_s is None or ttft_s * 1e3 > self.ttft_ms:
            return False
        if tpot_s is not None and tpot_s * 1e3 > self.tpot_ms:
            return False
        return self.e2el_ms is None or e2e_s * 1e3 <= self.e2el_ms

    def label(self) -> str:
        parts = [f"TTFT <= {self.ttft_ms:g} ms", f"TPOT <= {self.tpot_ms:g} ms"]
        return " and ".join(parts + ([f"E2E <= {self.e2el_ms:g} ms"] if self.e2el_ms is not None else []))


def parse_goodput(items: list[str]) -> SLO:
    """["ttft:500", "tpot:50", "e2el:4s"] -> SLO; items may also be comma-joined. A bare number is
    milliseconds, a unit (us, ms, s, min) may be given, as for `tierserve plan --slo` (durations.py)."""
    try:
        targets = {k: v * 1e3 for k, v in parse_targets(items, KEYS, ("ttft", "tpot"), "--goodput",
                                                           "ttft:500 tpot:50 [e2el:4000]").items()}
    except DurationError as exc:
        raise SLOError(str(exc)) from None
    if "e2el" in targets and targets["e2el"] < targets["ttft"]:
        raise SLOError(f"--goodput e2el:{targets['e2el']:g} is below ttft:{targets['ttft']:g}: no request could "
                       "meet it (the first token comes before the end)")
    return SLO(ttft_ms=targets["ttft"], tpot_ms=targets["tpot"], e2el_ms=targets.get("e2el"))
