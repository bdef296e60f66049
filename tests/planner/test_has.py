"""HAS stage 2 (Optuna TPE) and the baselines on scripted backends: seeding, stopping, budgets, resuming."""

from __future__ import annotations

import pytest
from plan_factories import SPACES, ScriptedBackend, outcome, smooth_score, space

from coordinator.planner.has import HasConfig, StudyError, stage2
from coordinator.planner.search import (
    SearchResult,
    TrialRecord,
    coordinate_search,
    random_search,
)
from coordinator.planner.space import Knobs, TrialConfig
from coordinator.planner.stopping import StoppingConfig

NO_STOP = StoppingConfig(enabled=False)


def test_seeds_are_enqueued_first_one_per_survivor():
    backend = ScriptedBackend(smooth_score)
    result = stage2(SPACES, backend, HasConfig(trials=5, stopping=NO_STOP))
    seeds = result.records[:3]
    assert all(r.seeded for r in seeds) and not any(r.seeded for r in result.records[3:])
    assert [r.config.allocation for r in seeds] == [s.allocation for s in SPACES]
    assert [r.config.knobs for r in seeds] == [
        Knobs(batch=4), Knobs(batch=3, s=0.4, split="dynamic"), Knobs(batch=2)]  # B_max, s*, no stealing
    assert backend.calls[:3] == [r.config for r in seeds]


def test_proposals_stay_inside_each_space():
    result = stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=20, stopping=NO_STOP, seed=3))
    assert len(result.records) == 20
    by_label = {s.allocation.label(): s for s in SPACES}
    for r in result.records:
        sp = by_label[r.config.allocation.label()]
        assert 1 <= r.config.knobs.batch <= sp.b_max
        if sp.s_range is None:
            assert r.config.knobs.s == 0.0 and r.config.knobs.split == "dynamic"
        else:
            assert sp.s_range[0] <= r.config.knobs.s <= sp.s_range[1]
        assert sp.can_steal or not r.config.knobs.stealing


def test_stops_when_top_three_agree():
    result = stage2(SPACES, ScriptedBackend(lambda c: 500.0), HasConfig(trials=30))
    assert len(result.records) == 3 and result.stop_reason == "top-3 trials within 1%"


def test_stops_after_five_trials_without_improvement():
    backend = ScriptedBackend(script=[900, 500, 100, 200, 300, 400, 800, 950])
    result = stage2(SPACES, backend, HasConfig(trials=30))
    assert [r.outcome.objective for r in result.records] == [900, 500, 100, 200, 300, 400]
    assert result.stop_reason == "5 trials in a row without improvement"


def test_rules_never_fire_before_every_seed_ran():
    one = [space("1xL4:E,1xL4:P+D")]
    flat = stage2(one, ScriptedBackend(lambda c: 7.0), HasConfig(trials=30))
    assert len(flat.records) == 3  # one seed, then the top-3 rule at the earliest
    many = [space(f"1xL4:E,{n}xL4:P+D") for n in range(1, 6)]
    result = stage2(many, ScriptedBackend(lambda c: 7.0), HasConfig(trials=30))
    assert len(result.records) == 5 and all(r.seeded for r in result.records)


def test_a_second_run_continues_the_stored_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    first_backend = ScriptedBackend(smooth_score)
    first = stage2(SPACES, first_backend, HasConfig(trials=4, stopping=NO_STOP, storage=url, study_name="s"))
    second_backend = ScriptedBackend(smooth_score)
    second = stage2(SPACES, second_backend, HasConfig(trials=7, stopping=NO_STOP, storage=url, study_name="s"))
    assert len(first.records) == 4 and len(second.records) == 7
    assert second.records[:4] == first.records  # rebuilt from storage, not re-run
    assert len(second_backend.calls) == 3
    assert sum(r.seeded for r in second.records) == len(SPACES)  # seeds enqueued once
    again = stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=7, stopping=NO_STOP, storage=url,
                                                                     study_name="s"))
    assert again.records == second.records  # budget spent: nothing more runs


def test_resumed_study_applies_the_stopping_rules_to_the_whole_history(tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    stage2(SPACES, ScriptedBackend(lambda c: 300.0), HasConfig(trials=3, stopping=NO_STOP, storage=url))
    backend = ScriptedBackend(lambda c: 300.0)
    result = stage2(SPACES, backend, HasConfig(trials=30, storage=url))
    assert backend.calls == [] and result.stop_reason == "top-3 trials within 1%"


def test_a_study_for_other_allocations_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=3, storage=url, study_name="s"))
    with pytest.raises(StudyError, match="was created for allocations"):
        stage2(SPACES[:2], ScriptedBackend(smooth_score), HasConfig(trials=3, storage=url, study_name="s"))


@pytest.mark.parametrize("url", ["notaurl", "sqlite:////nonexistent-dir/x.db"])
def test_unusable_storage_is_a_clear_error(url):
    with pytest.raises(StudyError, match="cannot open the study storage"):
        stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=3, storage=url))


@pytest.mark.parametrize("search", [random_search, coordinate_search])
@pytest.mark.parametrize("budget", [1, 7, 30])
def test_baselines_spend_exactly_the_budget(search, budget):
    backend = ScriptedBackend(smooth_score)
    result = search(SPACES, backend, budget, seed=1)
    assert len(result.records) == len(backend.calls) == budget == result.budget
    assert result.stop_reason is None and [r.number for r in result.records] == list(range(budget))


def test_has_never_exceeds_the_budget():
    result = stage2(SPACES, ScriptedBackend(smooth_score), HasConfig(trials=12, stopping=NO_STOP))
    assert len(result.records) == 12 == result.budget


def test_coordinate_search_tries_no_point_twice_and_climbs():
    backend = ScriptedBackend(smooth_score)
    result = coordinate_search(SPACES, backend, 30, seed=0)
    labels = [c.label() for c in backend.calls]
    assert len(labels) == len(set(labels))
    curve = result.best_so_far()
    assert curve == sorted(curve) and curve[-1] > curve[0]


def test_random_search_is_reproducible_per_seed():
    a = random_search(SPACES, ScriptedBackend(smooth_score), 10, seed=5)
    b = random_search(SPACES, ScriptedBackend(smooth_score), 10, seed=5)
    c = random_search(SPACES, ScriptedBackend(smooth_score), 10, seed=6)
    assert a.records == b.records and a.records != c.records


def test_best_breaks_ties_by_mean_ttft_then_tpot():
    config = TrialConfig(allocation=SPACES[0].allocation, knobs=Knobs(batch=1))
    records = [TrialRecord(number=i, config=config, outcome=o) for i, o in enumerate([
        outcome(10.0, ttft=0.5, tpot=0.02), outcome(10.0, ttft=0.4, tpot=0.03),
        outcome(10.0, ttft=0.4, tpot=0.02), outcome(9.0, ttft=0.1, tpot=0.01)])]
    result = SearchResult(method="has", budget=4, records=tuple(records))
    assert result.best().number == 2
    assert result.best_so_far() == [10.0, 10.0, 10.0, 10.0]
    near = [TrialRecord(number=0, config=config, outcome=outcome(10.0, ttft=0.5)),
            TrialRecord(number=1, config=config, outcome=outcome(9.95, ttft=0.1))]  # within 1%: a tie
    assert SearchResult(method="has", budget=2, records=tuple(near)).best().number == 1
    assert SearchResult(method="has", budget=2, records=tuple(near)).best(tie_tolerance=0.0).number == 0
