"""The layouts' simulation at each live run's speed over time (benchmarks/sim_fidelity_trace.py): a
'live' run that is the simulation under a known host trace is read back at that trace, and its figures come back,
where the run's mean speed alone misses them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_fidelity import workload
from benchmarks.sim_fidelity_layouts import LAYOUTS, METRICS, relative, sim_cell, simulate
from benchmarks.sim_fidelity_speed import at_run_speed, live_compute
from benchmarks.sim_fidelity_trace import (
    TRACE_BINS,
    TRACE_WINDOWS,
    at_run_trace,
    live_windows,
    sim_windows,
    trace_window_s,
)
from coordinator.planner.profile import Profile, pool_profiles
from coordinator.planner.sim_noise import HostTrace
from tests.planner.fidelity_fakes import saved_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile() -> Profile:
    saved = json.loads((REPO / "benchmarks/results/sim_fidelity.json").read_text())
    return pool_profiles([Profile.model_validate(c["profile"]) for c in saved["rates"]])


def test_live_windows_place_each_stage_where_it_ran():
    """Each stage at its time, split between the two windows whose middles it lies between."""
    saved = {"sent": [0.0, 1.0, 5.9, 6.0], "ttft": [0.1, 2.0, 0.1, 0.1], "e2e": [0.3, 4.0, 0.2, 0.2],
             "error": [None, None, None, "HTTP 503"], "encode_s": [1.0, 2.0, 4.0, 8.0],
             "prefill_s": [10.0, 20.0, 40.0, 80.0], "decode_s": [100.0, 200.0, 400.0, 800.0]}
    window = trace_window_s(saved)
    assert window == pytest.approx(1.0)                   # the sending span over TRACE_WINDOWS (6)
    windows = live_windows(saved, window)
    assert len(windows) == TRACE_WINDOWS
    # request 0 wholly in window 0 (before its middle); request 1's encode at 1.0 s half in window 0, half in 1
    assert windows[0] == pytest.approx({"encode": 1.0 + 1.0, "prefill": 10.0, "decode": 100.0})
    assert windows[1]["encode"] == pytest.approx(1.0)
    assert windows[2]["prefill"] == pytest.approx(10.0) and windows[3]["prefill"] == pytest.approx(10.0)   # at 3.0 s
    assert windows[3]["decode"] == pytest.approx(100.0)   # at 4.0 s, between windows 3's and 4's middles: half each
    assert windows[4]["decode"] == pytest.approx(100.0)
    assert windows[5] == pytest.approx({"encode": 4.0, "prefill": 40.0, "decode": 400.0})   # the failed one left out
    assert sum(w["decode"] for w in windows) == pytest.approx(700.0)
    # bins of window / TRACE_BINS, each at its middle: bin 35's at 35.5 / 8 = 4.4375 s, 1/16 of a window before
    # window 4's middle (4.5 s)
    bins = {0: {"decode": 1.0}, 35: {"decode": 2.0}, 99: {"decode": 4.0}}
    assert TRACE_BINS == 8
    folded = sim_windows(bins, 1.0)
    assert folded[0]["decode"] == 1.0 and folded[5]["decode"] == 4.0
    assert folded[4]["decode"] == pytest.approx(2.0 * 15 / 16) and folded[3]["decode"] == pytest.approx(2.0 / 16)


def test_a_run_under_a_known_trace_is_read_back_at_it(profile):
    """A run whose LLM steps are 1.0x the profile's for its first half and 1.3x for its second (the encoder 1.2x
    throughout): the reading finds every window's factor within 3 % (the 'live' compute sits on the requests around
    the simulation's bins: saved_run) and the figures within 2 %, where the run's mean speed alone misses its goodput
    under the layout's tight SLO by more than 3 % (epd at 6 req/s)."""
    layout = LAYOUTS["epd"]
    reqs = workload(6.0, profile.encode["image"].tokens_per_item).generate(80, seed=5)
    window = max(r.arrival for r in reqs) / TRACE_WINDOWS
    speed, truth = (1.2, 1.15, 1.15), HostTrace(window, encode=(1.0,) * TRACE_WINDOWS, llm=(0.87,) * 3 + (1.13,) * 3)
    saved = saved_run(simulate(layout, profile, reqs, record_compute=True, speed=speed, trace=truth), window)
    live = sim_cell(layout, profile, reqs, layout.slo, speed=speed, trace=truth)
    mean = at_run_speed(lambda s: sim_cell(layout, profile, reqs, layout.slo, speed=s), live_compute(saved))
    found = tuple(mean["speed"].values())
    traced = at_run_trace(lambda t: sim_cell(layout, profile, reqs, layout.slo, speed=found, trace=t),
                          live_windows(saved, window), window)
    assert traced["trace_mismatch"] < 0.01
    for stage, mean_factor, true_factor in (("encode", found[0], speed[0]), ("llm", found[2], speed[2])):
        measured = [mean_factor * f for f in traced["trace"][stage]]
        true = [true_factor * f for f in getattr(truth, stage)]
        assert measured == pytest.approx(true, rel=0.03), (stage, measured, true)
    errors = relative(traced, live)
    assert set(errors) == set(METRICS) and all(abs(e) < 0.02 for e in errors.values()), errors
    assert abs(relative(mean, live)["goodput_rps"]) > 0.03, relative(mean, live)
