"""Forecast a workload's rate and modality mix: one series forecaster per modality's arrival rate.

The total is the sum of the modalities' forecasts and the mix their shares of it, so a shift from images
to video is forecast as what it is (one rate falling, another rising) rather than as a share drifting
inside a constant. Pure, with the caller's clock, like the series forecasters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.oserve.forecast import ForecastConfig, Forecaster, Method, make_forecaster


@dataclass(frozen=True)
class WorkloadForecast:
    """The expected workload over one future window."""

    rate: float
    """Arrivals per second, all modalities."""
    mix: dict[str, float] = field(default_factory=dict)
    """Share of arrivals per modality (sums to 1 when rate > 0)."""

    def modality_rate(self, modality: str) -> float:
        return self.rate * self.mix.get(modality, 0.0)


class WorkloadForecaster:
    """Per-modality rate forecasters created on first sight of a modality (zeros before it)."""

    def __init__(self, method: Method, config: ForecastConfig | None = None) -> None:
        self.method = method
        self.config = config or ForecastConfig()
        self.series: dict[str, Forecaster] = {}
        self._times: list[float] = []

    def observe(self, now: float, rates: dict[str, float]) -> None:
        """Arrivals per second of each modality over the window ending at `now`; absent modalities saw 0."""
        for modality in rates:
            if modality not in self.series:
                f = make_forecaster(self.method, self.config)
                for t in self._times:  # it was there all along, at zero
                    f.observe(t, 0.0)
                self.series[modality] = f
        for modality, f in self.series.items():
            f.observe(now, rates.get(modality, 0.0))
        self._times.append(now)
        del self._times[:-self.config.arima_history]

    def forecast(self, now: float, horizon_s: float) -> WorkloadForecast:
        per = {m: f.forecast(now, horizon_s) for m, f in self.series.items()}
        total = sum(per.values())
        mix = {m: r / total for m, r in per.items()} if total > 0 else {}
        return WorkloadForecast(total, mix)
