"""Forecasters of one workload series (a rate, req/s, sampled once per window).

Pure objects like the policies: no wall clock and no I/O; the caller says what time it is
(`observe(now, value)`, `forecast(now, horizon_s)`), so the live loop, the benchmarks and the tests drive
the very same code. Observations come one per window of `step_s` seconds; a forecast `horizon_s` ahead is
ceil(horizon_s / step_s) steps ahead. Forecasts of a rate are never negative.

Methods: `last` (the baseline Dynamo's users compare against), `ewma` (a level), `holt` (level and damped
trend; with `season_steps` > 0 additive Holt-Winters), `arima` (statsmodels ARIMA refit on a sliding window,
as Dynamo's planner defaults to). statsmodels rather than pmdarima: its ARIMA is the maintained reference
implementation and pmdarima's auto_arima order search costs a second per refit, too slow for a loop that
runs every window.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections import deque
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["last", "ewma", "holt", "arima"]
METHODS: tuple[Method, ...] = ("last", "ewma", "holt", "arima")


class ForecastConfig(BaseModel):
    """Settings of every method (each reads its own)."""

    model_config = ConfigDict(frozen=True)

    step_s: float = Field(10.0, gt=0)
    """Seconds between observations (the monitor's window)."""
    alpha: float = Field(0.5, gt=0, le=1)
    """ewma, holt: weight of the newest observation in the level."""
    beta: float = Field(0.2, gt=0, le=1)
    """holt: weight of the newest slope in the trend."""
    damping: float = Field(0.9, gt=0, le=1)
    """holt: the trend's share kept per step ahead (1: straight line; < 1 flattens long horizons)."""
    gamma: float = Field(0.3, gt=0, le=1)
    """holt with seasons: weight of the newest seasonal deviation."""
    season_steps: int = Field(0, ge=0)
    """holt: season length in steps (0: no season, plain damped Holt)."""
    arima_order: tuple[int, int, int] = (1, 1, 1)
    """arima: (p, d, q)."""
    arima_history: int = Field(60, ge=8)
    """arima: observations each fit sees (a sliding window)."""
    arima_min_history: int = Field(12, ge=4)
    """arima: below this many observations it forecasts the last value."""


class Forecaster(ABC):
    """One series. `observe` one value per step in time order; `forecast` any horizon."""

    name: str = ""

    def __init__(self, config: ForecastConfig | None = None) -> None:
        self.config = config or ForecastConfig()
        self.last_t: float | None = None
        self.n = 0

    def observe(self, now: float, value: float) -> None:
        if self.last_t is not None and now <= self.last_t:
            raise ValueError(f"observations must move forward in time: got t={now} after t={self.last_t}")
        if not math.isfinite(value):
            raise ValueError(f"observation must be finite, got {value}")
        self.last_t, self.n = now, self.n + 1
        self._update(float(value))

    def forecast(self, now: float, horizon_s: float) -> float:
        """The value expected `horizon_s` after `now` (0 before any observation)."""
        if self.n == 0:
            return 0.0
        ahead = max(0.0, now + horizon_s - (self.last_t or now))
        steps = max(1, math.ceil(ahead / self.config.step_s - 1e-9))
        return max(0.0, self._predict(steps))

    @abstractmethod
    def _update(self, value: float) -> None: ...

    @abstractmethod
    def _predict(self, steps: int) -> float: ...


class LastValue(Forecaster):
    """Tomorrow is today: the last observation."""

    name = "last"

    def _update(self, value: float) -> None:
        self.value = value

    def _predict(self, steps: int) -> float:
        return self.value


class EWMA(Forecaster):
    """An exponentially weighted level: smooths noise, lags a trend."""

    name = "ewma"

    def _update(self, value: float) -> None:
        a = self.config.alpha
        self.level = value if self.n == 1 else a * value + (1 - a) * self.level

    def _predict(self, steps: int) -> float:
        return self.level


class Holt(Forecaster):
    """Level + damped trend (Gardner's damped Holt); with `season_steps` additive Holt-Winters."""

    name = "holt"

    def __init__(self, config: ForecastConfig | None = None) -> None:
        super().__init__(config)
        self.level = self.trend = 0.0
        m = self.config.season_steps
        self.season: list[float] = [0.0] * m
        self.first_season: list[float] = []
        """The first season's raw values (its mean starts the level, its deviations the season)."""

    def _update(self, value: float) -> None:
        c, m = self.config, self.config.season_steps
        if m and len(self.first_season) < m:  # learn one whole season before smoothing
            self.first_season.append(value)
            if len(self.first_season) == m:
                self.level = sum(self.first_season) / m
                self.season = [v - self.level for v in self.first_season]
            else:
                self.level = value
            return
        if self.n == 1:
            self.level = value
            return
        s_idx = (self.n - 1) % m if m else 0
        s = self.season[s_idx] if m else 0.0
        prev = self.level
        self.level = c.alpha * (value - s) + (1 - c.alpha) * (prev + c.damping * self.trend)
        self.trend = c.beta * (self.level - prev) + (1 - c.beta) * c.damping * self.trend
        if m:
            self.season[s_idx] = c.gamma * (value - self.level) + (1 - c.gamma) * s

    def _predict(self, steps: int) -> float:
        phi = self.config.damping
        damped = sum(phi**i for i in range(1, steps + 1))
        m = self.config.season_steps
        s = self.season[(self.n - 1 + steps) % m] if m and len(self.first_season) == m else 0.0
        return self.level + damped * self.trend + s


class Arima(Forecaster):
    """statsmodels ARIMA(p, d, q) refit on the last `arima_history` observations at each forecast (cached
    until the next observation); the last value while history is short or a fit fails (counted)."""

    name = "arima"

    def __init__(self, config: ForecastConfig | None = None) -> None:
        super().__init__(config)
        self.history: deque[float] = deque(maxlen=self.config.arima_history)
        self._fit: object | None = None
        self._start: object | None = None
        """The previous fit's parameters: the next fit starts there (a third of the iterations)."""
        self.failed_fits = 0
        """Fits that raised (singular, non-stationary start, ...): those forecasts were the last value."""

    def _update(self, value: float) -> None:
        self.history.append(value)
        self._fit = None

    def _predict(self, steps: int) -> float:
        if len(self.history) < self.config.arima_min_history or max(self.history) == min(self.history):
            return self.history[-1]
        if self._fit is None:
            self._fit = self._refit()
        if self._fit is False:
            return self.history[-1]
        return float(self._fit.forecast(steps)[-1])  # type: ignore[union-attr]

    def _refit(self):
        import numpy as np
        from statsmodels.tsa.arima.model import ARIMA

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence chatter on short noisy windows: the forecast still counts
            try:
                fit = ARIMA(np.asarray(self.history), order=self.config.arima_order).fit(start_params=self._start)
            except (ValueError, np.linalg.LinAlgError):
                self.failed_fits += 1
                self._start = None
                return False
        self._start = fit.params
        return fit


def make_forecaster(method: Method, config: ForecastConfig | None = None) -> Forecaster:
    """A fresh forecaster by name."""
    kinds = {"last": LastValue, "ewma": EWMA, "holt": Holt, "arima": Arima}
    if method not in kinds:
        raise ValueError(f"unknown forecaster {method!r}; choose one of {', '.join(kinds)}")
    return kinds[method](config)
