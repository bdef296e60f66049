"""The re-planner with a fake clock and a toy capacity model: no flapping on noise, a re-plan after a
sustained mix shift, the dwell time holds, and a cheaper plan must be cheaper by the margin."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.oserve.replanner import ReplanConfig, Replanner
from coordinator.oserve.workload_forecast import WorkloadForecast

CAPACITY = {"image": 10.0, "video": 2.0}
"""Toy model: req/s one GPU of a plan serves per modality (a plan is its GPU count)."""


def utilisation(gpus: int, fc: WorkloadForecast) -> float:
    return sum(fc.modality_rate(m) / (gpus * c) for m, c in CAPACITY.items())


def search(fc: WorkloadForecast, incumbent: int) -> int:
    """The fewest GPUs that put the forecast at the band's middle (0.6) or below."""
    return max(1, int(np.ceil(utilisation(1, fc) / 0.6)))


def make(plan=2, now=0.0, **cfg) -> Replanner[int]:
    return Replanner(ReplanConfig(**cfg), plan, utilisation, search, cost=lambda g: 3.0 * g, now=now)


def run(r: Replanner, forecasts, start=0.0, step=10.0):
    return [r.step(start + i * step, fc) for i, fc in enumerate(forecasts)]


def test_noise_around_a_steady_load_never_switches():
    rng = np.random.default_rng(0)
    r = make(plan=2, min_dwell_s=60)  # 2 GPUs at 12 req/s of images: utilisation 0.6
    forecasts = [WorkloadForecast(max(0.1, 12 + rng.normal(0, 2.5)), {"image": 1.0}) for _ in range(500)]
    decisions = run(r, forecasts)
    assert any(d.utilisation > 0.85 for d in decisions)  # single windows do leave the band...
    assert r.switches == 0 and all(d.action == "keep" for d in decisions)  # ...but never 3 in a row


def test_a_sustained_mix_shift_replans_once_after_the_hysteresis():
    r = make(plan=2, min_dwell_s=60, sustain_windows=3)
    steady = [WorkloadForecast(12.0, {"image": 1.0})] * 10
    shifted = [WorkloadForecast(12.0, {"image": 0.5, "video": 0.5})] * 20  # same rate, video costs 5x
    decisions = run(r, steady + shifted)
    switches = [i for i, d in enumerate(decisions) if d.action == "switch"]
    assert switches == [12]  # the third out-of-band window after the shift
    assert decisions[12].plan == r.plan == 6 and "over the band" in decisions[12].reason
    assert 0.35 <= utilisation(r.plan, shifted[0]) <= 0.85  # and the new plan sits inside the band


def test_the_dwell_time_holds_a_plan_however_far_the_load_moves():
    r = make(plan=2, min_dwell_s=300, now=0.0)
    decisions = run(r, [WorkloadForecast(40.0, {"image": 1.0})] * 40)  # twice what 2 GPUs take, every window
    first = next(i for i, d in enumerate(decisions) if d.action == "switch")
    assert first * 10.0 >= 300 and "dwell" in decisions[first - 1].reason
    switched_at = first * 10.0
    collapse = [WorkloadForecast(1.0, {"image": 1.0})] * 40  # the load collapses right after the switch
    held = run(r, collapse, start=switched_at + 10.0)
    again = [switched_at + 10.0 * (i + 1) for i, d in enumerate(held) if d.action == "switch"]
    assert again == [switched_at + 300.0]  # not one window earlier than the dwell allows
    assert "dwell" in held[int(300 / 10) - 2].reason and held[29].plan == 1 and "under the band" in held[29].reason


def test_under_the_band_a_plan_must_be_cheaper_by_the_margin():
    r = Replanner(ReplanConfig(min_dwell_s=0, sustain_windows=1, cheaper_margin=0.5), 4, utilisation,
                  lambda fc, inc: 3, cost=lambda g: float(g), now=0.0)
    d = r.step(10.0, WorkloadForecast(5.0, {"image": 1.0}))  # 4 GPUs at 5 req/s: 0.125
    assert d.action == "keep" and "not 50% less" in d.reason and r.plan == 4


def test_the_band_is_checked():
    with pytest.raises(ValueError, match="low < high"):
        ReplanConfig(low=0.9, high=0.8)
