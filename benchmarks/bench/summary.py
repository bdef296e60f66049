"""One cell's numbers (one system at one rate) from its per-request records.

Goodput is good requests divided by the cell's wall time, from its first scheduled arrival to its
last completion (DESIGN "Words"); throughput and output tokens/s use the same wall time, so the ratios
between them are exact. Percentiles are nearest-rank (benchmarks.stats) over completed requests.
"""

from __future__ import annotations

import statistics
from collections import Counter

from benchmarks.bench.client import RequestRecord
from benchmarks.bench.cost import Cost, per_1k_good, per_1m_tokens
from benchmarks.bench.slo import SLO
from benchmarks.stats import percentile


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    def r(v: float | None) -> float | None:
        return None if v is None else round(v * 1e3, 3)

    return {"mean": r(statistics.fmean(values)), "p50": r(percentile(values, 0.5)), "p90": r(percentile(values, 0.9)),
            "p99": r(percentile(values, 0.99))}


def judge(records: list[RequestRecord], slo: SLO | None) -> None:
    """Mark each record good: completed and (when an SLO is given) meeting it."""
    for r in records:
        r.good = r.ok and (slo is None or slo.met(r.ttft_s, r.tpot_s, r.e2e_s))


def summarize(records: list[RequestRecord], wall_s: float, slo: SLO | None, cost: Cost | None) -> dict:
    """The cell's summary; `records` must already be judged."""
    ok = [r for r in records if r.ok]
    good = sum(r.good for r in records)
    tokens = sum(r.output_tokens for r in ok)
    wall = max(wall_s, 1e-9)
    out = {
        "requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "errors": dict(Counter(r.error_type for r in records if not r.ok)), "wall_s": round(wall_s, 4),
        "throughput_rps": round(len(ok) / wall, 4), "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 3),
        "good": good, "goodput_rps": round(good / wall, 4),
        "slo_attainment": round(good / len(records), 4) if records else None,
        "ttft_ms": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": _ms([x for r in ok for x in r.itl_s]),
        "e2el_ms": _ms([r.e2e_s for r in ok if r.e2e_s is not None]),
    }
    if cost is not None:
        c1k, c1m = per_1k_good(cost.per_hour, good / wall), per_1m_tokens(cost.per_hour, tokens / wall)
        out |= {"cost_per_hour": cost.per_hour, "cost_per_1k_good": None if c1k is None else round(c1k, 6),
                "cost_per_1m_output_tokens": None if c1m is None else round(c1m, 6)}
    return out

