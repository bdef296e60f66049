"""The layouts' simulation at each live run's own speed (benchmarks/sim_fidelity_speed.py): the speed is read from
the workers' compute seconds, and a 'live' run that is the simulation at a known speed is simulated back at it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_fidelity_layouts import judge
from benchmarks.sim_fidelity_report import markdown
from benchmarks.sim_fidelity_speed import at_run_speed, live_compute, speed_factors
from coordinator.planner.profile import Profile, pool_profiles
from tests.planner.fidelity_fakes import simulated_report

REPO = Path(__file__).resolve().parents[2]


def test_live_compute_sums_the_finished_requests_and_leaves_out_what_was_not_saved():
    saved = {"error": [None, "HTTP 503", None], "decode_s": [0.1, 5.0, 0.2], "prefill_s": [0.01, 1.0, None]}
    assert live_compute(saved) == pytest.approx({"prefill": 0.01, "decode": 0.3})


def test_speed_factors_scale_by_live_over_simulated():
    live = {"encode": 1.2, "prefill": 1.0, "decode": 3.0}
    assert speed_factors(live, {"encode": 1.0, "prefill": 1.0, "decode": 2.0}, (1.0, 2.0)) == pytest.approx((1.2, 2.0 * 4 / 3))
    # records without encode or prefill (before 2026-12-06): the encoder's factor stays, the LLM's from decode alone
    assert speed_factors({"decode": 3.0}, {"encode": 1.0, "prefill": 9.0, "decode": 2.0}, (1.0, 1.0)) == pytest.approx((1.0, 1.5))


def test_the_iteration_finds_the_speed_whose_compute_is_the_runs():
    """Compute that stretches more than in proportion (steps overlapping on a shared core) still converges."""
    def simulate(speed):
        enc, llm = speed
        return {"compute_s": {"encode": 2.0 * enc, "prefill": 1.0 * llm ** 1.2, "decode": 4.0 * llm ** 1.2}, "x": llm}

    out = at_run_speed(simulate, {"encode": 2.6, "prefill": 1.5, "decode": 6.0})
    assert out["speed"]["encode"] == pytest.approx(1.3)
    assert 5.0 * out["x"] ** 1.2 == pytest.approx(7.5, rel=5e-3)


@pytest.fixture(scope="module")
def profile() -> Profile:
    saved = json.loads((REPO / "benchmarks/results/sim_fidelity.json").read_text())
    return pool_profiles([Profile.model_validate(c["profile"]) for c in saved["rates"]])


@pytest.mark.parametrize("name", ["epd", "stealing"])
def test_a_run_at_a_known_speed_is_simulated_back_at_it(name, profile):
    """The encoder's speed within 1 % (the layouts count a quarter-ish of a time-sliced forward's stretch,
    COMPUTE_STRETCHED, so its count moves with the speed: 1.2405-1.2567 read for 1.25; counted at its own length it
    came back exactly), the LLM's within 3 % (the simulation is discrete: ITERATIONS), the compute
    within 2 %; P50 TTFT and mean TPOT within 2 %, but for stealing at its top rate (9 req/s, its saturation on
    this host), where a step more or less flips which requests are stolen (TPOT +3.8 % at 1.44). 80 requests a
    rate: on 40 a speed 0.5 % off moved epd's P50 TTFT at 6 req/s by 3.7 % (the stack's "load" placement)."""
    report = simulated_report(name, profile, 80, seed=3, speed=(1.25, 1.4), record_compute=True)
    judge(report, 80, 3)
    for i, cell in enumerate(report["cells"]):
        for run in cell["sim_run_speed"]["runs"]:
            assert all(abs(m) < 0.02 for m in run["compute_mismatch"].values()), run["compute_mismatch"]
            assert run["speed"]["encode"] == pytest.approx(1.25, rel=0.01)
            assert run["speed"]["llm"] == pytest.approx(1.4, rel=0.001 if i == 0 else 0.03)
        # an even speed over the run reads as a flat trace: each window within 5 % (13-27 requests a window, and a
        # time-sliced forward's count moves with the speed; 3.7 % seen)
        for run in cell["sim_run_trace"]["runs"]:
            assert all(abs(f - 1) < 0.05 for stage in ("encode", "llm") for f in run["trace"][stage]), run["trace"]
        errors = cell["error_run_speed"]
        if name == "epd" or i < 2:
            assert abs(errors["ttft_p50_s"]) < 0.02 and abs(errors["tpot_mean_s"]) < 0.02, errors
        assert cell["error"]["tpot_mean_s"] < -0.15              # at the profile's speed it is too fast
    table = markdown({"command": "x", "date": "d", "requests_per_rate": 80, "seed": 3, "machine": "m",
                      "layouts": [report]})
    assert "At each live run's own speed" in table and "1.25, 1.40" in table
    assert "0 of 3 at the profiles' speed" in table
