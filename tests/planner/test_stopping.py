"""HAS stage 2's stopping rules on hand-made objective histories (higher is better)."""

from __future__ import annotations

import pytest

from coordinator.planner.stopping import (
    StoppingConfig,
    stop_reason,
    top_k_converged,
    trials_without_improvement,
)

SEEDS = StoppingConfig()  # top-3 within 1%, 5 trials without improvement


@pytest.mark.parametrize("values,stops", [
    ([10.0, 100.0, 99.5, 99.2], True),     # best three: 100, 99.5, 99.2 -> 0.8% apart
    ([100.0, 99.0, 98.9], False),          # 1.1% apart
    ([100.0, 99.0, 99.0], False),          # exactly 1%: "under 1%" is strict
    ([100.0, 100.0], False),               # fewer than three trials
    ([0.0, 0.0, 0.0], False),              # three zeros are not three equally good configurations
])
def test_top_three_within_one_percent(values, stops):
    assert top_k_converged(values, 3, 0.01) is stops
    assert (stop_reason(values, SEEDS) == "top-3 trials within 1%") is stops


@pytest.mark.parametrize("values,stale", [
    ([], 0),
    ([5.0], 0),
    ([5.0, 1.0, 2.0, 3.0, 4.0], 4),
    ([5.0, 1.0, 2.0, 3.0, 4.0, 5.0], 5),   # equalling the best is no improvement
    ([1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 3.0], 0),
    ([0.0, 0.0, 0.0], 2),
])
def test_trials_without_improvement(values, stale):
    assert trials_without_improvement(values) == stale


def test_five_trials_in_a_row_without_improvement_stop():
    assert stop_reason([5.0, 1.0, 2.0, 3.0, 4.0], SEEDS) is None
    assert stop_reason([5.0, 1.0, 2.0, 3.0, 4.0, 4.5], SEEDS) == "5 trials in a row without improvement"
    assert stop_reason([5.0, 1.0, 2.0, 3.0, 4.0, 6.0], SEEDS) is None  # a new best resets the count


def test_rules_wait_for_min_trials_and_can_be_disabled():
    converged = [100.0, 100.0, 100.0, 100.0]
    assert stop_reason(converged, SEEDS.model_copy(update={"min_trials": 5})) is None
    assert stop_reason(converged + [1.0], SEEDS.model_copy(update={"min_trials": 5})) is not None
    assert stop_reason(converged, StoppingConfig(enabled=False)) is None
