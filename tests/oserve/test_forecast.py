"""Forecasters: each method's contract, and its errors on synthetic traces with known structure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.oserve.evaluate import score
from coordinator.oserve.forecast import METHODS, ForecastConfig, make_forecaster
from coordinator.oserve.traces import SHAPES, make_trace
from coordinator.oserve.workload_forecast import WorkloadForecaster


def feed(method, values, config=None, step=10.0):
    f = make_forecaster(method, config or ForecastConfig(step_s=step))
    for i, v in enumerate(values):
        f.observe((i + 1) * step, v)
    return f


@pytest.mark.parametrize("method", METHODS)
def test_every_method_forecasts_a_constant_exactly_and_never_negative(method):
    f = feed(method, [4.0] * 20)
    assert f.forecast(200.0, 10.0) == pytest.approx(4.0, abs=1e-6)
    falling = feed(method, [max(0.0, 20 - 2 * i) for i in range(20)], ForecastConfig(step_s=10, damping=1.0))
    assert falling.forecast(200.0, 100.0) >= 0.0


@pytest.mark.parametrize("method", METHODS)
def test_time_must_move_forward_and_values_be_finite(method):
    f = make_forecaster(method)
    assert f.forecast(0.0, 10.0) == 0.0  # nothing seen yet
    f.observe(10.0, 1.0)
    with pytest.raises(ValueError, match="forward in time"):
        f.observe(10.0, 2.0)
    with pytest.raises(ValueError, match="finite"):
        f.observe(20.0, math.nan)


def test_unknown_method_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="last, ewma, holt, arima"):
        make_forecaster("prophet")  # type: ignore[arg-type]


def test_last_value_repeats_the_last_observation_whatever_the_horizon():
    f = feed("last", [1.0, 5.0, 3.0])
    assert f.forecast(30.0, 10.0) == f.forecast(30.0, 600.0) == 3.0


def test_holt_follows_a_line_and_the_horizon_counts_in_steps():
    f = feed("holt", [2.0 + 0.5 * i for i in range(40)], ForecastConfig(step_s=10, damping=1.0, alpha=0.8, beta=0.5))
    last = 2.0 + 0.5 * 39
    assert f.forecast(400.0, 10.0) == pytest.approx(last + 0.5, abs=0.05)
    assert f.forecast(400.0, 30.0) == pytest.approx(last + 1.5, abs=0.1)
    assert f.forecast(400.0, 25.0) == f.forecast(400.0, 30.0)  # 2.5 steps ahead is the third window
    ewma = feed("ewma", [2.0 + 0.5 * i for i in range(40)])
    assert ewma.forecast(400.0, 10.0) < last  # a level lags a trend


def test_holt_winters_learns_a_season():
    season = [1.0, 3.0, 5.0, 3.0]
    f = feed("holt", season * 10, ForecastConfig(step_s=10, season_steps=4, damping=1.0))
    assert [round(f.forecast(400.0, 10.0 * k), 3) for k in (1, 2, 3, 4)] == pytest.approx(season, abs=0.05)


def test_arima_falls_back_to_last_value_on_short_history():
    f = feed("arima", [1.0, 2.0, 3.0])
    assert f.forecast(30.0, 10.0) == 3.0


def test_workload_forecast_splits_rate_by_modality_and_backfills_a_new_one():
    f = WorkloadForecaster("last", ForecastConfig(step_s=10))
    f.observe(10.0, {"image": 4.0})
    f.observe(20.0, {"image": 3.0, "video": 1.0})
    fc = f.forecast(20.0, 10.0)
    assert fc.rate == pytest.approx(4.0) and fc.mix == pytest.approx({"image": 0.75, "video": 0.25})
    assert fc.modality_rate("video") == pytest.approx(1.0) and fc.modality_rate("audio") == 0.0
    f.observe(30.0, {"video": 2.0})  # no image arrivals in this window
    assert f.forecast(30.0, 10.0).mix == {"image": 0.0, "video": 1.0}


def test_traces_are_seeded_and_have_their_structure():
    a, b = make_trace("burst", 1200, 5.0, seed=3), make_trace("burst", 1200, 5.0, seed=3)
    assert np.array_equal(a.counts["image"], b.counts["image"])
    assert a.mean["image"].max() == pytest.approx(20.0)
    shift = make_trace("mix_shift", 1000, 5.0)
    assert shift.mean["image"][0] / 5.0 > 0.85 and shift.mean["video"][-1] / 5.0 > 0.85
    assert np.allclose(shift.mean["image"] + shift.mean["video"], 5.0)
    assert make_trace("ramp", 1000, 5.0).mean["image"][-1] == pytest.approx(15.0, rel=0.01)
    with pytest.raises(ValueError, match="unknown trace shape"):
        make_trace("sawtooth")  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", SHAPES)
def test_smoothing_beats_last_value_against_the_true_rate_on_steady_traces(shape):
    """Against the structure (not the Poisson noise), a level smooths: EWMA's error is below last value's on
    traces that move slowly relative to a window; it is not on bursts (it lags them), which is why the
    benchmark reports every method on every trace instead of one winner."""
    trace = make_trace(shape, 1800, 5.0, seed=1)
    last, ewma = score(trace, "last"), score(trace, "ewma")
    assert last.windows == ewma.windows > 100
    if shape in ("constant", "ramp", "mix_shift"):
        assert ewma.mae_truth < 0.8 * last.mae_truth
    if shape == "mix_shift":
        assert ewma.mix_mae < 0.1


def test_arima_beats_last_value_on_a_noisy_constant():
    trace = make_trace("constant", 400, 5.0, seed=2)
    arima, last = score(trace, "arima"), score(trace, "last")
    assert arima.windows == last.windows == 28
    assert arima.mae_truth < last.mae_truth
