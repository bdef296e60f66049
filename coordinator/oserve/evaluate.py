"""Score a forecaster on a trace: rolling origin, one forecast per window, compared with what came.

At the end of each window the forecaster sees that window's rates and forecasts the window `horizon`
windows ahead; that forecast is scored against the window's observed rate (what the monitor will count)
and against the trace's true mean rate (the structure, without Poisson noise). Windows before `warmup`
are not scored, so every method is judged on the same windows.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from coordinator.oserve.forecast import ForecastConfig, Method
from coordinator.oserve.traces import Trace
from coordinator.oserve.workload_forecast import WorkloadForecaster


@dataclass(frozen=True)
class Score:
    """Errors of one method on one trace (rates in req/s)."""

    method: str
    trace: str
    windows: int
    """Forecasts scored."""
    mae: float
    """Mean |forecast - observed rate| of the total."""
    mae_truth: float
    """Mean |forecast - true mean rate| of the total."""
    mape: float
    """Mean |forecast - observed| / observed (windows with observed > 0)."""
    mix_mae: float
    """Mean |forecast share - observed share| of the first modality (0 with one modality)."""
    ms_per_forecast: float
    """Wall time of one observe + forecast, in milliseconds."""

    def as_dict(self) -> dict:
        return asdict(self)


def rolling_forecasts(trace: Trace, method: Method, config: ForecastConfig, horizon: int = 1,
                      warmup: int = 12) -> tuple[np.ndarray, np.ndarray, float]:
    """(forecast total rate, forecast share of the first modality) for every window, NaN where unscored,
    and the seconds spent."""
    step = int(config.step_s)
    if step != config.step_s or step < 1:
        raise ValueError(f"step_s must be a whole number of seconds for a per-second trace, got {config.step_s}")
    obs = trace.windows(step)
    n = len(next(iter(obs.values())))
    first = next(iter(obs))
    rate, share = np.full(n, np.nan), np.full(n, np.nan)
    f = WorkloadForecaster(method, config)
    t0 = time.perf_counter()
    for i in range(n - horizon):
        now = (i + 1) * step
        f.observe(now, {m: float(v[i]) for m, v in obs.items()})
        if i + 1 < warmup:
            continue
        fc = f.forecast(now, horizon * step)
        rate[i + horizon], share[i + horizon] = fc.rate, fc.mix.get(first, 0.0)
    return rate, share, time.perf_counter() - t0


def score(trace: Trace, method: Method, config: ForecastConfig | None = None, horizon: int = 1,
          warmup: int = 12) -> Score:
    """The method's errors on the trace."""
    config = config or ForecastConfig()
    rate, share, spent = rolling_forecasts(trace, method, config, horizon, warmup)
    step = int(config.step_s)
    obs, truth = trace.windows(step), trace.windows(step, "mean")
    total = sum(obs.values())
    true_total = sum(truth.values())
    mask = ~np.isnan(rate)
    first = next(iter(obs))
    with np.errstate(invalid="ignore", divide="ignore"):
        obs_share = np.where(total > 0, obs[first] / total, np.nan)
    pos = mask & (total > 0)
    mix = np.abs(share - obs_share)[mask & ~np.isnan(obs_share)] if len(obs) > 1 else np.zeros(1)
    return Score(method=method, trace=trace.name, windows=int(mask.sum()),
                 mae=float(np.mean(np.abs(rate - total)[mask])),
                 mae_truth=float(np.mean(np.abs(rate - true_total)[mask])),
                 mape=float(np.mean((np.abs(rate - total) / total)[pos])),
                 mix_mae=float(np.mean(mix)) if mix.size else 0.0,
                 ms_per_forecast=1000 * spent / max(1, len(total) - horizon))
