"""The host noise read from a live run's timers (benchmarks/sim_fidelity_noise.py): the statistics by hand, the
reading on a model of its own, a 'live' run that is the simulation with known noise read back, and the simulation
that averages several draws of the noise."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import benchmarks.sim_fidelity_noise as noise
from benchmarks.sim_fidelity import workload
import benchmarks.sim_fidelity_layouts as lay
from benchmarks.sim_fidelity_layouts import (
    COORDINATOR_SHARE,
    DRAW_SEED_STRIDE,
    IMAGE_REQUESTS_BEFORE,
    LAYOUTS,
    METRICS,
    noisy_cell,
    sim_cell,
    simulate,
)
from benchmarks.sim_fidelity_noise import (
    MIN_STEPS,
    SPAN,
    at_run_noise,
    live_step_stats,
    mean_of_draws,
    next_sigma,
    step_stats,
)
from coordinator.planner.profile import Profile, pool_profiles
from coordinator.planner.sim_noise import HostNoise

REPO = Path(__file__).resolve().parents[2]


def test_step_stats_by_hand():
    """Mean decode steps alternating around 3 ms (lag-1 autocorrelation near -1) and rising (near +1); requests
    with fewer than MIN_STEPS decode steps, or no decode compute, left out."""
    logs = [math.log(0.003) + (0.2 if i % 2 else -0.2) for i in range(20)]
    tokens = [11] * 20
    decode = [math.exp(x) * 10 for x in logs]
    spread, lag1 = step_stats(decode + [9.0, None], tokens + [MIN_STEPS, 30])   # the last two do not count
    assert spread == pytest.approx((np.percentile(logs, 90) - np.percentile(logs, 10)) / SPAN)
    assert lag1 == pytest.approx(-19 / 20)
    rising = [0.003 * (1 + 0.01 * i) * 10 for i in range(20)]
    assert step_stats(rising, tokens)[1] > 0.8
    assert step_stats(decode[:9], tokens[:9]) is None                     # too few requests
    assert step_stats([0.03] * 20, tokens) is None                        # all alike: no correlation to read
    saved = {"error": [None] * 19 + ["HTTP 503"], "decode_s": decode, "output_tokens": tokens}
    assert live_step_stats(saved) == pytest.approx(step_stats(decode[:19], tokens[:19]))
    assert live_step_stats({"error": [None], "output_tokens": [3]}) is None   # records before 2026-12-06


def test_next_sigma_adds_the_spreads_as_variances():
    assert next_sigma(0.3, 0.1, []) == pytest.approx(math.sqrt(0.08))
    # a round at sigma 0.2 spread 0.2: c = sqrt(0.2^2 - 0.1^2) / 0.2
    assert next_sigma(0.3, 0.1, [(0.2, 0.2)]) == pytest.approx(math.sqrt(0.08) / (math.sqrt(0.03) / 0.2))
    assert next_sigma(0.05, 0.1, [(0.2, 0.2)]) == 0.0                     # narrower than without noise: none


def test_the_reading_finds_the_sigma_period_and_speed_of_a_model():
    """A model run: spread^2 = 0.05^2 + (0.7 sigma)^2, neighbours alike by period / (period + 0.3), compute growing
    with the noise's mean: the sigma, the period and the speed that give the target are read back."""
    def simulate(speed, sigma, period):
        mean = math.exp(sigma * sigma / 2)
        return {"step_stats": (math.hypot(0.05, 0.7 * sigma), period / (period + 0.3)),
                "compute_s": {"encode": 2.0 * speed[0], "prefill": 1.0 * speed[1] * mean,
                              "decode": 4.0 * speed[2] * mean}}

    sigma = 0.35
    target = (math.hypot(0.05, 0.7 * sigma), 0.5 / 0.8)
    live = {"encode": 2.4, "prefill": 1.2 * math.exp(sigma ** 2 / 2), "decode": 5.2 * math.exp(sigma ** 2 / 2)}
    out = at_run_noise(simulate, live, target)
    assert out["period_s"] == 0.5
    assert out["sigma"] == pytest.approx(sigma, rel=0.01)
    assert [out["speed"][k] for k in ("encode", "prefill", "decode")] == pytest.approx([1.2, 1.2, 1.3], rel=0.01)


@pytest.fixture(scope="module")
def profile() -> Profile:
    saved = json.loads((REPO / "benchmarks/results/sim_fidelity.json").read_text())
    return pool_profiles([Profile.model_validate(c["profile"]) for c in saved["rates"]])


def _live(profile: Profile, sigma: float, period_s: float) -> tuple[dict, functools.partial]:
    """A 'live' epd run at 6 req/s: the simulation at speed (1.25, 1.15, 1.4) with host noise (seed 7, which the
    reading does not use), saved with each request's decode compute as its worker's timer would report it."""
    layout, n, i = LAYOUTS["epd"], 80, 1
    reqs = workload(layout.rates[i], profile.encode["image"].tokens_per_item).generate(n, seed=3)
    before = IMAGE_REQUESTS_BEFORE + 2 * n * i
    result = simulate(layout, profile, reqs, routed_before=before, speed=(1.25, 1.15, 1.4), record_compute=True,
                      noise=HostNoise(sigma=sigma, period_s=period_s, seed=7))
    by_stage = {"decode_s": [result.decode_compute_s.get(r.request.request_id) for r in result.records],
                "output_tokens": [r.request.output_tokens for r in result.records],
                "error": [None] * len(result.records)}
    return ({"stats": live_step_stats(by_stage), "compute": dict(result.compute_s)},   # compute: as live_compute
            functools.partial(noisy_cell, layout, profile, reqs, layout.slo, None, None, before, COORDINATOR_SHARE, 0))


def test_a_noisy_run_is_read_back_near_its_noise_and_a_quiet_one_as_quiet(profile, monkeypatch):
    """The 'live' run's noise, 0.3 per 500 ms, read back from its requests' decode compute: sigma within 20 % and
    the period within one step of the grid (another seed's neighbours are alike by chance in other ways: 0.2-1 s),
    the compute within 3 %. The same run without noise reads sigma under 0.05 (its spread is the batches')."""
    monkeypatch.setattr(noise, "PERIODS_S", (0.05, 0.2, 0.5, 1.0))
    monkeypatch.setattr(lay, "NOISE_DRAWS", 1)   # the reading of one draw (averaging draws: the test below)
    live, cell = _live(profile, 0.3, 0.5)
    out = at_run_noise(cell, live["compute"], live["stats"])
    assert out["sigma"] == pytest.approx(0.3, rel=0.2), out
    assert out["period_s"] in (0.2, 0.5, 1.0), out["lag1_by_period"]
    # the compute matched: the speed carries what the reading's own draw (another seed) adds on average, here
    # ~0.89x of the 'live' speed for each stage
    assert all(abs(m) < 0.03 for m in out["compute_mismatch"].values()), out["compute_mismatch"]
    quiet, cell = _live(profile, 0.0, 0.5)
    assert quiet["stats"][0] < 0.7 * live["stats"][0]   # this profile's decode step grows with the batch: 0.17
    assert at_run_noise(cell, quiet["compute"], quiet["stats"])["sigma"] < 0.05


def test_draws_are_averaged_number_by_number():
    a = {"goodput_rps": 2.0, "step_stats": (0.1, 0.3), "spread": {"ttft": [1.0, 3.0]}, "note": "x", "flag": True,
         "missing": None, "stolen": 4}
    b = {"goodput_rps": 4.0, "step_stats": (0.3, 0.5), "spread": {"ttft": [3.0, 5.0]}, "note": "y", "flag": False,
         "missing": 1.0, "stolen": 1}
    assert mean_of_draws([a, b]) == {"goodput_rps": 3.0, "step_stats": pytest.approx((0.2, 0.4)),
                                     "spread": {"ttft": [2.0, 4.0]}, "note": "x", "flag": True, "missing": None,
                                     "stolen": 2.5}
    assert mean_of_draws([a]) == a
    with pytest.raises(ValueError, match="no draws"):
        mean_of_draws([])
    with pytest.raises(ValueError, match="length"):
        mean_of_draws([{"s": [1.0]}, {"s": [1.0, 2.0]}])


def test_a_noisy_simulation_is_the_mean_of_its_draws(profile, monkeypatch):
    """noisy_cell with NOISE_DRAWS draws: every judged figure the mean of sim_cell at seeds seed, seed + stride, ...,
    and draw_spread their range; one draw is the seed's own simulation; without noise, one simulation (range 0)."""
    layout, n = LAYOUTS["epd"], 40
    reqs = workload(layout.rates[1], profile.encode["image"].tokens_per_item).generate(n, seed=3)
    args = (layout, profile, reqs, layout.slo, None, None, IMAGE_REQUESTS_BEFORE, COORDINATOR_SHARE)
    speed = (1.1, 1.0, 1.2)
    singles = [sim_cell(*args, speed, noise=HostNoise(sigma=0.4, period_s=0.1, seed=5 + DRAW_SEED_STRIDE * d))
               for d in range(3)]
    assert len({x["ttft_p50_s"] for x in singles}) == 3                   # the draws differ
    monkeypatch.setattr(lay, "NOISE_DRAWS", 3)
    out = noisy_cell(*args, 5, speed, 0.4, 0.1)
    for m in METRICS:
        assert out[m] == pytest.approx(sum(x[m] for x in singles) / 3)
        assert out["draw_spread"][m] == pytest.approx(max(x[m] for x in singles) - min(x[m] for x in singles))
    assert out["compute_s"]["decode"] == pytest.approx(sum(x["compute_s"]["decode"] for x in singles) / 3)
    monkeypatch.setattr(lay, "NOISE_DRAWS", 1)
    one = noisy_cell(*args, 5, speed, 0.4, 0.1)
    assert {m: one[m] for m in METRICS} == {m: singles[0][m] for m in METRICS}
    monkeypatch.setattr(lay, "NOISE_DRAWS", 3)
    quiet = noisy_cell(*args, 5, speed, 0.0, 0.1)
    assert quiet["draw_spread"] == {m: 0.0 for m in METRICS}
    assert {m: quiet[m] for m in METRICS} == {m: sim_cell(*args, speed)[m] for m in METRICS}
