"""Sliding-window arrival-rate (λ) estimate for one encode worker; pure, the clock comes in as `now`.

Estimator: λ = (n - 1) / (t_last - t_first) over the n arrivals kept (those not older than the window,
and at most the `max_samples` newest). Why this one rather than n / window:

- n - 1 inter-arrival gaps over the time they actually span is the maximum-likelihood rate of a
  Poisson stream, so it is right from the first few samples, where n / window under-reads until a
  whole window has been seen (a fresh worker, or one that was idle longer than the window).
- Memory is bounded by `max_samples` without biasing it: capping n / window would clip the rate at
  max_samples / window, whereas the span estimator just uses a shorter window at high λ, where the
  samples are plentiful (1024 gaps: about 3 % relative error) and fast tracking is worth the most.
- It reacts to drift as fast as the window lets old arrivals fall out (both estimators do), and is no
  noisier than n / window: both rest on the same number of arrivals.

Between arrivals only the pruning of old samples changes it; a stream that stops entirely drops below
`min_samples` once its last arrivals leave the window, and the rate becomes unknown again (None).
"""

from __future__ import annotations

from collections import deque


class ArrivalRate:
    """Arrivals per second over the last `window_s` seconds; None until `min_samples` are in the window."""

    def __init__(self, window_s: float, min_samples: int = 2, max_samples: int = 1024) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if min_samples < 2:
            raise ValueError(f"min_samples must be >= 2 (a rate needs one gap), got {min_samples}")
        if max_samples < min_samples:
            raise ValueError(f"max_samples ({max_samples}) must be >= min_samples ({min_samples})")
        self.window_s = window_s
        self.min_samples = min_samples
        self._times: deque[float] = deque(maxlen=max_samples)

    def observe(self, now: float) -> None:
        """Record one arrival at `now` (seconds, any monotonic origin; it must not go backwards)."""
        if self._times and now < self._times[-1]:
            now = self._times[-1]  # keep the samples sorted even if a caller's clock steps back
        self._times.append(now)
        self._prune(now)

    def rate(self, now: float) -> float | None:
        """λ in arrivals/s, or None when fewer than `min_samples` arrivals (or no elapsed time) are in the window."""
        self._prune(now)
        n = len(self._times)
        if n < self.min_samples:
            return None
        span = self._times[-1] - self._times[0]
        return (n - 1) / span if span > 0 else None

    def __len__(self) -> int:
        """Arrivals currently kept (as of the last observe/rate call)."""
        return len(self._times)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._times and self._times[0] < horizon:
            self._times.popleft()
