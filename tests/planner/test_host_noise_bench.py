"""benchmarks/host_noise.py's reading of a duration series: window spreads, and the HostNoise they fit."""

from __future__ import annotations

import pytest

from benchmarks.host_noise import fit, main, model_spreads, window_spreads


def test_a_factor_that_holds_for_a_period_shows_below_it_and_fades_beyond():
    spreads = model_spreads(sigma=0.15, period_ms=100, op_ms=1.6, seconds=8.0, jitter=0.02)
    assert spreads[25] == pytest.approx(0.15, abs=0.04)           # windows inside one factor's period
    assert spreads[1000] < 0.65 * spreads[25]                      # a median over ten periods moves less
    flat = model_spreads(sigma=0.0, period_ms=100, op_ms=1.6, seconds=8.0, jitter=0.02)
    assert max(flat.values()) < 0.02                               # per-op jitter alone: medians barely move


def test_the_fit_recovers_the_noise_that_made_the_series():
    ends, t = [], 0.0
    spreads = model_spreads(sigma=0.12, period_ms=250, op_ms=2.0, seconds=6.0, jitter=0.03)
    got = fit(spreads, op_ms=2.0, seconds=6.0)
    assert got["sigma"] == pytest.approx(0.12, abs=0.04) and got["period_ms"] in (100, 250, 500)
    for _ in range(100):                                           # constant durations: no spread at all
        t += 0.002
        ends.append(t)
    assert all(v < 1e-9 for v in window_spreads(ends, (5, 10, 25)).values())


def test_too_short_a_run_is_refused():
    with pytest.raises(SystemExit):
        main(["--seconds", "1"])
