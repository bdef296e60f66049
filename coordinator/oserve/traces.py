"""Synthetic workload traces with known structure: per-second arrivals of each modality.

Each trace has a mean curve (arrivals per second, per modality, known exactly) and a seeded Poisson draw
of it (what a monitor would count). Forecasters are judged on them (tests and benchmarks/oserve_forecast.py),
and benchmarks/oserve.py turns a compressed day into simulator workloads window by window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Shape = Literal["constant", "ramp", "diurnal", "burst", "mix_shift", "day"]
SHAPES: tuple[Shape, ...] = ("constant", "ramp", "diurnal", "burst", "mix_shift")
"""The forecast suite's traces ("day" is the benchmark's compressed day)."""


@dataclass(frozen=True)
class Trace:
    """Per-second mean rates and counts, by modality."""

    name: str
    mean: dict[str, np.ndarray]
    """The true arrival rate (req/s) at each second."""
    counts: dict[str, np.ndarray]
    """A Poisson draw of it: arrivals counted in each second."""

    @property
    def seconds(self) -> int:
        return len(next(iter(self.mean.values())))

    def windows(self, step_s: int, which: Literal["counts", "mean"] = "counts") -> dict[str, np.ndarray]:
        """Per-window average rate (req/s) of each modality, windows of `step_s` whole seconds."""
        n = self.seconds // step_s
        src = self.counts if which == "counts" else self.mean
        return {m: v[: n * step_s].reshape(n, step_s).mean(axis=1) for m, v in src.items()}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def mean_curves(shape: Shape, seconds: int, base: float, seed: int) -> dict[str, np.ndarray]:
    """The trace's mean rates per modality (seeded only for the bursts' times)."""
    t = np.arange(seconds, dtype=float)
    frac = t / seconds
    image = np.full(seconds, base)
    video = np.zeros(seconds)
    if shape == "ramp":  # 1x to 3x over the trace
        image = base * (1 + 2 * frac)
    elif shape == "diurnal":  # three cycles, trough a fifth of the peak
        image = base * (1 + 0.67 * np.sin(2 * np.pi * 3 * frac))
    elif shape == "burst":  # 4x for 30 s, a few times, at seeded moments
        rng = np.random.default_rng(seed + 1)
        for start in rng.choice(np.arange(60, max(61, seconds - 60)), size=max(1, seconds // 600), replace=False):
            image[start : start + 30] *= 4
    elif shape == "mix_shift":  # the same total, image-heavy then video-heavy
        share = 0.9 - 0.8 * _sigmoid((frac - 0.5) * 20)
        image, video = base * share, base * (1 - share)
    elif shape == "day":  # a compressed day: quiet night, image morning, video evening peak
        hour = 24 * frac
        load = 0.25 + 0.75 * np.exp(-((hour - 11) / 3.5) ** 2) + 0.9 * np.exp(-((hour - 20) / 2.5) ** 2)
        video_share = 0.1 + 0.6 * _sigmoid((hour - 16) * 1.2) * (1 - _sigmoid((hour - 23) * 2))
        image, video = base * load * (1 - video_share), base * load * video_share
    return {"image": image, "video": video} if video.any() else {"image": image}


def make_trace(shape: Shape, seconds: int = 3600, base: float = 5.0, seed: int = 0) -> Trace:
    """One trace of `seconds` seconds around `base` req/s."""
    if shape not in (*SHAPES, "day"):
        raise ValueError(f"unknown trace shape {shape!r}; choose one of {', '.join((*SHAPES, 'day'))}")
    mean = mean_curves(shape, seconds, base, seed)
    rng = np.random.default_rng(seed)
    counts = {m: rng.poisson(v).astype(float) for m, v in mean.items()}
    return Trace(shape, mean, counts)
