"""WorkStealing: when requests are kept, encode always first, bookkeeping, and the one-step delay bound."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from coordinator.policies.work_stealing import WorkStealing, WorkStealingConfig

ENCODE_S = 0.020
STEP_S = 0.008
EPS = 1e-9


def policy(pending: int | None = 0, remote: int | None = 5, at: float = 0.0, **knobs) -> WorkStealing:
    """An enabled policy (unless knobs say otherwise) that has seen the encode queue and remote load."""
    p = WorkStealing(WorkStealingConfig(**{"enabled": True, **knobs}))
    if pending is not None:
        p.observe_encode_queue(pending, at)
    p.observe_remote_load(remote, at)
    return p


def keep_all(p: WorkStealing, n: int, now: float) -> int:
    """Offer n requests as the runtime would; how many were kept."""
    kept = 0
    for i in range(n):
        if p.should_keep(now):
            p.started(f"r{p.stolen_total}-{i}", now)
            kept += 1
    return kept


# --- when to keep -------------------------------------------------------------------------------

def test_default_config_is_disabled():
    assert WorkStealingConfig() == WorkStealingConfig(enabled=False, max_stolen=4, remote_load_threshold=1,
                                                      quiet_s=0.0)


@pytest.mark.parametrize("remote", [None, 0, 1, 100])
def test_disabled_never_steals(remote):
    p = policy(enabled=False, remote=remote)
    assert [p.should_keep(t) for t in (0.0, 1.0, 100.0)] == [False, False, False]
    assert p.may_step(1.0) is False


def test_steals_with_empty_queue_under_cap_above_threshold():
    p = policy(max_stolen=3, remote_load_threshold=2, remote=2)
    assert keep_all(p, 5, 0.0) == 3
    assert p.stolen_in_flight == 3 and p.should_keep(0.0) is False
    p.finished("r0-0", 0.1)
    assert p.should_keep(0.1) is True


def test_never_steals_while_an_encode_batch_waits():
    p = policy()
    p.observe_encode_queue(1, 1.0)
    assert p.should_keep(1.0) is False and p.should_keep(50.0) is False
    p.observe_encode_queue(0, 2.0)
    assert p.should_keep(2.0) is True


@pytest.mark.parametrize("load, threshold, keep", [(0, 1, False), (1, 1, True), (2, 3, False), (3, 3, True),
                                                   (0, 0, True)])
def test_remote_load_threshold(load, threshold, keep):
    assert policy(remote=load, remote_load_threshold=threshold).should_keep(0.0) is keep


def test_no_remote_worker_alive_waives_the_threshold_but_not_the_cap():
    p = policy(remote=None, remote_load_threshold=10, max_stolen=2)
    assert keep_all(p, 4, 0.0) == 2
    p.observe_remote_load(0, 0.1)
    p.finished("r0-0", 0.1)
    assert p.should_keep(0.1) is False  # a remote worker is back, and idle: send it there


def test_nothing_kept_before_both_signals_are_observed():
    p = WorkStealing(WorkStealingConfig(enabled=True, remote_load_threshold=0))
    assert p.should_keep(0.0) is False
    p.observe_encode_queue(0, 0.0)
    assert p.should_keep(0.0) is False  # remote load never reported
    p.observe_remote_load(0, 0.0)
    assert p.should_keep(0.0) is True
    q = WorkStealing(WorkStealingConfig(enabled=True, remote_load_threshold=0))
    q.observe_remote_load(0, 0.0)
    assert q.should_keep(0.0) is False  # encode queue never reported


def test_quiet_period_counts_from_the_last_waiting_batch():
    p = policy(quiet_s=0.05, at=0.0)
    assert p.should_keep(0.049) is False and p.should_keep(0.05) is True
    p.observe_encode_queue(2, 1.0)
    p.observe_encode_queue(1, 1.02)
    p.observe_encode_queue(0, 1.04)  # last waiting batch taken to encode at 1.04
    p.observe_encode_queue(0, 1.06)  # repeated "still empty" reports do not restart the period
    assert p.should_keep(1.08) is False  # end of the burst's last batch: too soon
    assert p.should_keep(1.09) is True


def test_should_keep_is_a_pure_query():
    p = policy(max_stolen=1)
    assert all(p.should_keep(0.0) for _ in range(10))
    assert p.stolen_in_flight == 0 and p.stolen_total == 0


# --- when to step -------------------------------------------------------------------------------

def test_may_step_false_while_encode_pending_and_true_after():
    p = policy()
    assert p.may_step(0.0) is False  # nothing stolen: nothing to step
    p.started("a", 0.0)
    assert p.may_step(0.0) is True
    p.observe_encode_queue(1, 0.01)
    assert p.may_step(0.01) is False
    p.observe_encode_queue(3, 0.02)
    assert p.may_step(0.02) is False
    p.observe_encode_queue(0, 0.03)
    assert p.may_step(0.03) is True
    p.finished("a", 0.04)
    assert p.may_step(0.04) is False


def test_disabled_still_steps_requests_already_taken():
    p = policy(enabled=False)
    p.started("taken-before-disable", 0.0)
    assert p.should_keep(0.0) is False
    assert p.may_step(0.0) is True
    p.observe_encode_queue(1, 0.1)
    assert p.may_step(0.1) is False


# --- bookkeeping --------------------------------------------------------------------------------

def test_bookkeeping_and_stats():
    p = policy()
    assert (p.stolen_in_flight, p.stolen_total, p.stolen_seconds, p.longest_step_s) == (0, 0, 0.0, 0.0)
    p.started("a", 0.0)
    p.started("b", 0.0)
    p.record_step(0.008, 0.008)
    p.record_step(0.012, 0.020)
    p.finished("a", 0.020)
    p.started("c", 0.03)
    assert (p.stolen_in_flight, p.stolen_total) == (2, 3)
    assert p.stolen_seconds == pytest.approx(0.020)
    assert p.longest_step_s == 0.012
    with pytest.raises(ValueError, match="'b'.*already in flight"):
        p.started("b", 0.04)
    with pytest.raises(ValueError, match="'a'.*not a stolen request"):
        p.finished("a", 0.04)


@pytest.mark.parametrize("seconds", [-0.001, float("nan"), float("inf")])
def test_record_step_rejects_bad_durations(seconds):
    with pytest.raises(ValueError, match="seconds="):
        policy().record_step(seconds, 0.0)


def test_observations_reject_negative_counts():
    p = policy()
    with pytest.raises(ValueError, match="pending_batches=-1"):
        p.observe_encode_queue(-1, 0.0)
    with pytest.raises(ValueError, match="min_remote_load=-2"):
        p.observe_remote_load(-2, 0.0)


@pytest.mark.parametrize("field, value", [("max_stolen", 0), ("max_stolen", -3), ("remote_load_threshold", -1),
                                          ("quiet_s", -0.5), ("quiet_s", float("inf")),
                                          ("quiet_s", float("nan"))])
def test_config_validation_names_field_and_value(field, value):
    with pytest.raises(ValidationError) as info:
        WorkStealingConfig(**{field: value})
    message = str(info.value)
    assert field in message and f"input_value={value!r}" in message


def test_config_is_frozen():
    with pytest.raises(ValidationError):
        WorkStealingConfig().max_stolen = 8  # type: ignore[misc]


# --- the delay bound on a simulated timeline ----------------------------------------------------

def simulate(p: WorkStealing, seed: int, batches: int = 3000,
             may_step: Callable[[float], bool] | None = None) -> list[float]:
    """Drive `p` through a seeded random trace the way the encode worker's loop does; return, per encode
    batch, how long stolen work delayed its start: start - max(arrival, end of the previous encode).

    Loop: if may_step: one engine step (STEP_S); elif a batch waits: encode it (ENCODE_S), then offer each
    of its requests to should_keep; else sleep until the next arrival. Arrivals and remote-load reports
    are observed at their own times, before any query at a later time.
    """
    rng = random.Random(seed)
    may_step = may_step or p.may_step
    arrivals, t = [], 0.0
    for _ in range(batches):
        # Bursts and lulls: mostly short gaps, sometimes long ones, so stolen work overlaps arrivals.
        t += rng.expovariate(1 / 0.005) if rng.random() < 0.6 else rng.expovariate(1 / 0.08)
        arrivals.append(t)
    waiting: deque[float] = deque()
    steps_left: dict[str, int] = {}
    nxt, now, encoded_until, delays, ids = 0, 0.0, 0.0, [], 0
    p.observe_encode_queue(0, 0.0)

    def admit(until: float) -> None:
        nonlocal nxt
        while nxt < len(arrivals) and arrivals[nxt] <= until:
            waiting.append(arrivals[nxt])
            p.observe_encode_queue(len(waiting), arrivals[nxt])
            nxt += 1

    while nxt < len(arrivals) or waiting or steps_left:
        admit(now)
        if may_step(now):
            now += STEP_S
            p.record_step(STEP_S, now)
            for rid in list(steps_left):
                steps_left[rid] -= 1
                if steps_left[rid] == 0:
                    del steps_left[rid]
                    p.finished(rid, now)
        elif waiting:
            arrived = waiting.popleft()
            p.observe_encode_queue(len(waiting), now)
            delays.append(now - max(arrived, encoded_until))
            now += ENCODE_S
            encoded_until = now
            admit(now)
            p.observe_remote_load(rng.choice([None, 0, 1, 1, 2, 3, 6]), now)
            for _ in range(rng.randint(1, 4)):
                if p.should_keep(now):
                    assert not waiting, "kept a request while an encode batch was waiting"
                    ids += 1
                    steps_left[f"s{ids}"] = 1 + rng.randint(1, 12)  # one prefill, then decode steps
                    p.started(f"s{ids}", now)
                    assert p.stolen_in_flight <= p.config.max_stolen
        elif steps_left:
            raise AssertionError(f"stolen work stuck at t={now}: {sorted(steps_left)}")
        else:
            now = max(now, arrivals[nxt])
    assert p.stolen_in_flight == 0
    assert len(delays) == batches
    return delays


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("knobs", [{}, {"max_stolen": 8, "remote_load_threshold": 0},
                                   {"quiet_s": 0.01, "remote_load_threshold": 2}, {"max_stolen": 1}])
def test_encode_is_never_delayed_by_more_than_one_engine_step(seed, knobs):
    p = policy(pending=None, remote=None, **knobs)
    delays = simulate(p, seed)
    assert max(delays) <= STEP_S + EPS, max(delays)
    # Not vacuous: work was stolen, and stolen steps really did overlap some arrivals.
    assert p.stolen_total > 50
    assert p.stolen_seconds > 0 and p.longest_step_s == STEP_S
    assert sum(d > EPS for d in delays) > 20


def test_disabled_timeline_steals_nothing_and_never_delays():
    p = policy(pending=None, remote=None, enabled=False)
    assert max(simulate(p, seed=7)) <= EPS
    assert p.stolen_total == 0 and p.stolen_seconds == 0.0


def test_the_bound_catches_a_runtime_that_ignores_the_encode_queue():
    """The harness has teeth: stepping whenever stolen work exists (ignoring waiting batches) breaks the bound."""
    p = policy(pending=None, remote=None, max_stolen=8, remote_load_threshold=0)
    delays = simulate(p, seed=0, may_step=lambda now: p.stolen_in_flight > 0)
    assert max(delays) > STEP_S + EPS


# --- the live runtime's view: a held count instead of completions ----------------------------------

def test_observed_load_caps_a_batch_and_frees_up_when_the_engine_reports_less():
    p = policy(max_stolen=4)
    p.observe_local_load(3, 0.0)
    assert keep_all(p, 5, 0.0) == 1  # 3 held + 1 kept = the cap, within one batch
    assert p.stolen_in_flight == 4 and p.may_step(0.0)
    p.observe_local_load(1, 1.0)  # two finished in the other process
    assert p.stolen_in_flight == 1 and keep_all(p, 5, 1.0) == 3
    p.observe_local_load(0, 2.0)
    assert p.stolen_in_flight == 0 and not p.may_step(2.0)
    assert p.stolen_total == 4


def test_observed_load_must_be_a_count():
    with pytest.raises(ValueError, match="held=-1"):
        policy().observe_local_load(-1, 0.0)


def test_a_busy_remote_tier_is_needed_unless_none_is_alive_with_observed_load():
    p = policy(remote=0, remote_load_threshold=2)
    p.observe_local_load(0, 0.0)
    assert keep_all(p, 3, 0.0) == 0
    p.observe_remote_load(None, 0.1)
    assert keep_all(p, 3, 0.1) == 3
