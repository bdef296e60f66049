"""benchmarks/oserve.py and oserve_accounting.py on a ten-minute step trace: timeline, switch charge, oracle.

Two real plans from the planner (a quick search): `small` for 1 req/s of images, `big` for 5 req/s. The
strategies' searches answer from a library of those two (Plans.memo filled per rate), so the test checks
the benchmark's accounting, not the planner's search.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.oserve import BenchConfig, Plans, replan_run
from benchmarks.oserve_accounting import (
    Run,
    account,
    added_cost,
    day_requests,
    segments,
    simulator,
)
from coordinator.oserve.planner_bridge import PlannerBridge
from coordinator.oserve.replanner import ReplanConfig
from coordinator.oserve.traces import Trace
from coordinator.planner.goodput import SLO

SLO_ = SLO(ttft_s=5.0, tpot_s=0.1)


@pytest.fixture(scope="module")
def world():
    bridge = PlannerBridge("qwen2.5-vl-7b", "4xRTX4090", trials=2, requests_per_trial=20)
    small, big = bridge.plan_for("image", 1.0, SLO_), bridge.plan_for("image", 5.0, SLO_)
    assert small is not None and big is not None and big.cost_per_hour() > small.cost_per_hour()
    mean = np.r_[np.full(300, 1.0), np.full(300, 5.0)]
    trace = Trace("step", {"image": mean}, {"image": np.random.default_rng(3).poisson(mean).astype(float)})
    cfg = BenchConfig(model="qwen2.5-vl-7b", pool="4xRTX4090", slo=SLO_, seconds=600, step_s=10, horizon_s=30,
                      window_s=100, switch_s=30, replan=ReplanConfig(min_dwell_s=60, sustain_windows=2))
    plans = Plans(bridge, cfg.rate_grid)
    for k in range(-25, 25):  # the library: below 2.5 req/s the small plan, above it the big one
        rate = plans.rounded(cfg.rate_grid ** k)
        plans.memo[("image", rate)] = small if rate < 2.5 else big
    simulate = simulator(day_requests(trace, cfg.model, 0), bridge, SLO_)
    return cfg, trace, plans, small, big, simulate


def test_timeline_cuts_at_switches_and_windows(world):
    _, _, _, small, big, _ = world
    run = Run("x", small, switches=[(150.0, big)])
    segs = segments(run, 300, 100, 30)
    assert [(s.start, s.end, s.plan is big) for s in segs] == [
        (0, 100, False), (100, 150, False), (150, 180, False), (180, 200, True), (200, 300, True)]
    assert segs[2].extra_per_hour == pytest.approx(added_cost(small, big)) and added_cost(small, big) > 0
    assert added_cost(big, small) == 0  # shrinking starts nothing new


def test_a_switch_is_charged_and_the_old_plan_serves_during_it(world):
    cfg, trace, _, small, big, simulate = world
    down = Run("down", big, switches=[(320.0, small)])
    slow, instant = (account(down, trace.seconds, cfg.window_s, s, simulate) for s in (60, 0))
    extra = (big.cost_per_hour() - small.cost_per_hour()) * 60 / 3600  # the big plan is paid 60 s longer
    assert sum(r["dollars"] for r in slow) - sum(r["dollars"] for r in instant) == pytest.approx(extra)
    assert slow[3]["switching_s"] == 60 and instant[3]["switching_s"] == 0
    # while switching up under the 5 req/s load, the small plan still serves: fewer good requests
    up = Run("up", small, switches=[(300.0, big)])
    late, now = (account(up, trace.seconds, cfg.window_s, s, simulate) for s in (90, 0))
    assert sum(r["good"] for r in late) < sum(r["good"] for r in now)
    everyone = len(day_requests(trace, cfg.model, 0))
    assert sum(r["requests"] for r in late) == sum(r["requests"] for r in now) == everyone


def test_oracle_is_never_worse_than_static_per_window_and_replanning_switches(world):
    cfg, trace, plans, small, _, simulate = world
    static = account(Run("static", small), trace.seconds, cfg.window_s, cfg.switch_s, simulate)
    oracle_run = replan_run("oracle", trace, plans, small, cfg)
    last_run = replan_run("replan-last", trace, plans, small, cfg)
    assert len(oracle_run.switches) >= 1 and len(last_run.switches) >= 1
    assert oracle_run.switches[0][0] < last_run.switches[0][0]  # it knew the step was coming
    oracle = account(oracle_run, trace.seconds, cfg.window_s, cfg.switch_s, simulate)
    for o, s in zip(oracle, static):
        assert o["requests"] == s["requests"]
        assert o["good_per_dollar"] >= s["good_per_dollar"] - 1e-9, (o, s)
    assert sum(r["switching_s"] for r in oracle) == pytest.approx(cfg.switch_s * len(oracle_run.switches))
    total = lambda rows: sum(r["good"] for r in rows) / sum(r["dollars"] for r in rows)
    assert total(oracle) > total(static) and math.isfinite(total(oracle))


@pytest.mark.parametrize("args", [["--band", "0.9,0.5"], ["--band", "x"], ["--methods", "prophet"], ["--seconds", "5"]])
def test_bad_flags_are_messages_with_exit_2(args, capsys):
    from benchmarks.oserve import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
