"""OffloadRouter: the local share holds over every window, fallbacks don't skew it, s changes live."""

from __future__ import annotations

import random

import pytest

from coordinator.policies.offload import OffloadCounts, OffloadRouter

WINDOW = 100
TOLERANCE = 0.05


def route_both(router: OffloadRouter, n: int) -> list[bool]:
    """n prefills with both sides available; True where it went local."""
    return [router.route(True, True) == "local" for _ in range(n)]


def window_counts(decisions: list[bool], width: int = WINDOW) -> list[int]:
    return [sum(decisions[i:i + width]) for i in range(len(decisions) - width + 1)]


ODD_SHARES = [0.01, 0.05, 0.123, 1 / 3, 0.5, 0.617, 2 / 3, 0.95, 0.999]


@pytest.mark.parametrize("s", [0.0, 0.3, 0.7, 1.0, *ODD_SHARES])
def test_every_window_of_100_is_within_tolerance(s):
    decisions = route_both(OffloadRouter(s), 600)
    counts = window_counts(decisions)
    assert len(counts) == 501
    for i, local in enumerate(counts):
        assert abs(local / WINDOW - s) <= TOLERANCE, (s, i, local)
        # The Bresenham schedule is in fact within one request of W*s in any window.
        assert abs(local - WINDOW * s) < 1 + 1e-9, (s, i, local)


@pytest.mark.parametrize("seed", range(5))
def test_random_shares_hold_the_window_bound(seed):
    rng = random.Random(seed)
    for _ in range(20):
        s = rng.random()
        for local in window_counts(route_both(OffloadRouter(s), 520)):
            assert abs(local / WINDOW - s) <= TOLERANCE, (s, local)


def test_prefixes_stay_within_half_a_request():
    decisions = route_both(OffloadRouter(0.3), 200)
    for k in range(1, 201):
        assert abs(sum(decisions[:k]) - 0.3 * k) <= 0.5 + 1e-9


@pytest.mark.parametrize("s, expected", [(0.0, "remote"), (1.0, "local")])
def test_extremes_never_route_the_other_way(s, expected):
    router = OffloadRouter(s)
    assert {router.route(True, True) for _ in range(300)} == {expected}


def test_fallback_to_the_available_side():
    router = OffloadRouter(1.0)
    assert router.route(False, True) == "remote"
    router = OffloadRouter(0.0)
    assert router.route(True, False) == "local"
    assert router.route(False, False) is None
    assert router.counts == OffloadCounts(local=0, remote=0, fallback_local=1, fallback_remote=0, rejected=1)


def test_outage_does_not_cause_a_catch_up_burst():
    router = OffloadRouter(0.7)
    before = route_both(router, 150)
    outage = [router.route(False, True) for _ in range(80)]
    assert outage == ["remote"] * 80
    after = route_both(router, 300)
    # Right after recovery, the next 100 are at s, not skewed towards local to make up for the outage.
    for local in window_counts(after):
        assert abs(local / WINDOW - 0.7) <= TOLERANCE
    # And the both-available decisions, outage cut out, form one unbroken schedule.
    for local in window_counts(before + after):
        assert abs(local - WINDOW * 0.7) < 1 + 1e-9


def test_intermittent_unavailability_keeps_both_available_windows_tight():
    rng = random.Random(7)
    router = OffloadRouter(0.3)
    both: list[bool] = []
    for _ in range(2000):
        local_ok, remote_ok = rng.random() > 0.2, rng.random() > 0.1
        side = router.route(local_ok, remote_ok)
        if local_ok and remote_ok:
            both.append(side == "local")
        elif local_ok or remote_ok:
            assert side == ("local" if local_ok else "remote")
        else:
            assert side is None
    assert len(both) > 500
    for local in window_counts(both):
        assert abs(local / WINDOW - 0.3) <= TOLERANCE


def test_set_share_mid_stream_converges():
    router = OffloadRouter(0.3)
    old = route_both(router, 250)
    router.set_share(0.8)
    assert router.share == pytest.approx(0.8)
    new = route_both(router, 400)
    for local in window_counts(new):
        assert abs(local / WINDOW - 0.8) <= TOLERANCE
    # Windows straddling the change are close to the blend of the two shares.
    joined = old + new
    for start in range(len(old) - WINDOW + 1, len(old)):
        k_old = len(old) - start
        blend = 0.3 * k_old + 0.8 * (WINDOW - k_old)
        assert abs(sum(joined[start:start + WINDOW]) - blend) <= 1.5 + 1e-9
    assert router.realised_share == pytest.approx(0.8, abs=0.01)


def test_set_share_to_same_value_keeps_the_schedule():
    a, b = OffloadRouter(0.37), OffloadRouter(0.37)
    first = route_both(a, 50)
    a.set_share(0.37)
    assert first + route_both(a, 150) == route_both(b, 200)


def test_realised_share_and_counts():
    router = OffloadRouter(0.25, window=8)
    assert router.realised_share is None
    route_both(router, 8)
    assert router.realised_share == pytest.approx(0.25)
    for _ in range(8):
        router.route(True, False)
    assert router.realised_share == 1.0
    counts = router.counts
    assert (counts.local, counts.remote, counts.fallback_local) == (2, 6, 8)


@pytest.mark.parametrize("s", [-0.1, 1.01, float("nan")])
def test_share_out_of_range_is_rejected(s):
    with pytest.raises(ValueError, match="s="):
        OffloadRouter(s)
    router = OffloadRouter(0.5)
    with pytest.raises(ValueError, match="s="):
        router.set_share(s)


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window=0"):
        OffloadRouter(0.5, window=0)


def test_realised_share_reports_only_the_current_share():
    r = OffloadRouter(0.0)
    for _ in range(60):
        r.route(True, True)
    assert r.realised_share == 0.0
    r.set_share(0.5)
    assert r.realised_share is None
    for _ in range(40):
        r.route(True, True)
    assert r.realised_share == 0.5


def test_route_by_load_falls_back_only_while_the_other_side_has_room():
    r = OffloadRouter(0.5)
    assert [r.route_by_load([4], [1, 9], saturation_load=4) for _ in range(3)] == ["remote"] * 3
    assert r.counts.fallback_remote == 3 and r.counts.local == 0   # the schedule did not advance
    assert [r.route_by_load([3], [4, 5], saturation_load=4) for _ in range(2)] == ["local"] * 2
    assert [r.route_by_load([4], [4], saturation_load=4) for _ in range(4)].count("local") == 2
    assert r.route_by_load([], [4], saturation_load=4) == "remote"        # no local worker at all
    assert r.route_by_load([], [], saturation_load=4) is None
