"""HAS's enqueued trials: warm starts first, then each survivor's B_max seed, then (pass_through_seeds) B = 1."""

from __future__ import annotations

import pytest
from plan_factories import SPACES, ScriptedBackend, smooth_score

from coordinator.planner.allocation import parse_allocation
from coordinator.planner.has import HasConfig, seed_points, stage2
from coordinator.planner.space import Knobs, TrialConfig
from coordinator.planner.stopping import StoppingConfig

NO_STOP = StoppingConfig(enabled=False)


def test_starts_run_first_clipped_into_their_space_then_the_seeds():
    start = TrialConfig(allocation=SPACES[1].allocation, knobs=Knobs(batch=9, s=0.95, split="none"))
    backend = ScriptedBackend(smooth_score)
    result = stage2(SPACES, backend, HasConfig(trials=8, stopping=NO_STOP, pass_through_seeds=True), starts=[start])
    clipped = Knobs(batch=3, s=0.6, split="none")  # B_max 3, s window (0.2, 0.6)
    assert backend.calls[0] == TrialConfig(allocation=SPACES[1].allocation, knobs=clipped)
    assert [c.knobs.batch for c in backend.calls[1:7]] == [4, 3, 2, 1, 1, 1]  # B_max seeds, then B = 1 seeds
    assert all(r.seeded for r in result.records[:7]) and not result.records[7].seeded


def test_a_start_equal_to_a_seed_runs_once():
    start = TrialConfig(allocation=SPACES[0].allocation, knobs=SPACES[0].seed())
    points = seed_points(SPACES, HasConfig(), [start])
    assert len(points) == len(SPACES) and points[0] == (0, SPACES[0].seed())


def test_the_rules_wait_for_every_enqueued_trial():
    flat = stage2(SPACES, ScriptedBackend(lambda c: 7.0), HasConfig(trials=30, pass_through_seeds=True))
    assert len(flat.records) == 2 * len(SPACES) and all(r.seeded for r in flat.records)


def test_a_start_outside_every_space_is_refused():
    stranger = TrialConfig(allocation=parse_allocation("2xL4:E,1xL4:P+D"), knobs=Knobs(batch=1))
    with pytest.raises(ValueError, match="in no search space"):
        stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=4), starts=[stranger])
