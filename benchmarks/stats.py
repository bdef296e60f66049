"""Small statistics shared by the benchmarks."""

from __future__ import annotations


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]); None for no samples."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
