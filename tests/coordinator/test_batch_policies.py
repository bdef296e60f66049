"""Micro-batch policies and the arrival-rate estimator, on a fake clock (times are plain numbers)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field

import pytest

from coordinator.policies.adaptive import AdaptiveMicroBatch, idle_kappa
from coordinator.policies.base import Arrival, BatchPolicy, BatchPolicyConfig, Release
from coordinator.policies.fixed_timeout import FixedTimeout
from coordinator.policies.pass_through import PassThrough
from coordinator.policies.queue_length import QueueLengthTrigger
from coordinator.policies.rate import ArrivalRate
from coordinator.policies.registry import BATCH_POLICIES, make_batch_policy

EPS = 1e-9


def _cfg(name: str = "adaptive", **kw) -> BatchPolicyConfig:
    return BatchPolicyConfig(name=name, **kw)


def _arrive(policy: BatchPolicy, now: float, rid: str = "r") -> list[Release]:
    """What the dispatcher does on a submit: observe, then decide at the same instant."""
    policy.observe(Arrival(rid), now)
    return policy.decide(now)


@dataclass
class Trace:
    """What a caller loop saw: each release as (time, count), and each request's wait."""

    releases: list[tuple[float, int]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)


def _run(policy: BatchPolicy, arrivals: list[float], max_batch: int, *, rng: random.Random | None = None,
         on_arrival=None) -> Trace:
    """Drive `policy` like the dispatcher: arrivals and deadlines in time order, checking the contract.

    With `rng`, the caller sometimes observes an arrival without deciding (a simulator batching events),
    and takes all arrivals of one instant before deciding; next_deadline must then say a decision is due.
    """
    trace, fifo, deadline, i = Trace(), [], None, 0

    def take(now: float) -> None:
        for rel in policy.decide(now):
            assert 1 <= rel.count <= max_batch, rel
            assert rel.count <= len(fifo), (rel, len(fifo))
            trace.releases.append((now, rel.count))
            for t in fifo[:rel.count]:
                trace.waits.append(now - t)
            del fifo[:rel.count]

    while i < len(arrivals) or deadline is not None:
        upcoming = arrivals[i] if i < len(arrivals) else math.inf
        # A lazy caller takes every arrival of an instant before it asks: bursts reach decide together.
        if deadline is not None and (deadline < upcoming or (deadline == upcoming and rng is None)):
            now = deadline
            take(now)
            decided = True
        else:
            now = upcoming
            i += 1
            fifo.append(now)
            policy.observe(Arrival(f"r{i}"), now)
            if on_arrival:
                on_arrival(policy, now)
            decided = rng is None or rng.random() < 0.5
            if decided:
                take(now)
        deadline = policy.next_deadline(now)
        # After decide(now) nothing may still be due now; before it, "due now" is said as `now`.
        assert deadline is None or deadline > now or (deadline == now and not decided), (deadline, now)
    assert not fifo, "requests left queued with no deadline"
    return trace


def _poisson(rng: random.Random, rate: float, start: float, duration: float) -> list[float]:
    out, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= start + duration:
            return out
        out.append(t)


# --- κ and the rate estimator ---------------------------------------------------------------------


def test_kappa_exact_values():
    assert idle_kappa(2, 0.6) == pytest.approx(-math.log(0.4), rel=1e-12)
    assert idle_kappa(2, 0.6) == pytest.approx(0.916290731874155, rel=1e-12)
    assert idle_kappa(8, 0.6) == pytest.approx(-math.log(1 - 0.6 ** (1 / 7)), rel=1e-12)
    assert idle_kappa(8, 0.6) == pytest.approx(2.6539028053970926, rel=1e-12)
    assert idle_kappa(1, 0.6) == 0.0  # B=1: pass-through
    assert AdaptiveMicroBatch(_cfg(max_batch=8, fill_probability=0.6)).kappa == idle_kappa(8, 0.6)
    # larger B or larger p: wait longer for the batch to fill
    assert idle_kappa(16, 0.6) > idle_kappa(8, 0.6) and idle_kappa(8, 0.7) > idle_kappa(8, 0.6)
    assert math.isfinite(idle_kappa(100_000, 0.6))
    with pytest.raises(ValueError):
        idle_kappa(0, 0.6)


def test_rate_unknown_below_min_samples_then_exact_for_even_spacing():
    est = ArrivalRate(window_s=10.0, min_samples=3)
    est.observe(0.0)
    est.observe(0.1)
    assert est.rate(0.1) is None
    est.observe(0.2)
    assert est.rate(0.2) == pytest.approx(10.0)
    for k in range(3, 50):
        est.observe(k * 0.1)
    assert est.rate(4.9) == pytest.approx(10.0)


def test_rate_forgets_arrivals_older_than_the_window():
    est = ArrivalRate(window_s=1.0, min_samples=2)
    for k in range(10):
        est.observe(k * 0.1)  # 10/s up to 0.9
    assert est.rate(1.5) == pytest.approx(10.0)  # 0.5..0.9 still in the window
    assert len(est) == 5
    assert est.rate(2.0) is None  # all gone: unknown again
    assert len(est) == 0


def test_rate_memory_is_bounded_and_unbiased():
    est = ArrivalRate(window_s=1e6, min_samples=2, max_samples=64)
    for k in range(10_000):
        est.observe(k * 0.001)
    assert len(est) == 64
    assert est.rate(9.999) == pytest.approx(1000.0)


def test_rate_simultaneous_arrivals_are_no_measurement():
    est = ArrivalRate(window_s=1.0, min_samples=2)
    est.observe(5.0)
    est.observe(5.0)
    assert est.rate(5.0) is None


@pytest.mark.parametrize("kw", [{"window_s": 0.0}, {"window_s": 1.0, "min_samples": 1},
                                {"window_s": 1.0, "min_samples": 5, "max_samples": 4}])
def test_rate_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        ArrivalRate(**kw)


# --- pass-through, fixed timeout, queue length --------------------------------------------------------


def test_pass_through_releases_each_arrival_alone():
    p = PassThrough(_cfg("pass_through", max_batch=8))
    assert _arrive(p, 0.0) == [Release(1)]
    assert p.next_deadline(0.0) is None
    for t in (1.0, 1.0, 1.0):
        p.observe(Arrival("x"), t)
    assert p.next_deadline(1.0) == 1.0  # something is due now
    assert p.decide(1.0) == [Release(1)] * 3
    assert p.next_deadline(1.0) is None and p.decide(2.0) == []


def test_fixed_timeout_time_and_size_triggers():
    p = FixedTimeout(_cfg("fixed_timeout", max_batch=4, timeout_s=0.05))
    assert p.next_deadline(0.0) is None
    assert _arrive(p, 0.0) == [] and _arrive(p, 0.01) == []
    assert p.next_deadline(0.01) == pytest.approx(0.05)  # first arrival + timeout, not last
    assert p.decide(0.049) == []
    assert p.decide(0.05) == [Release(2)]
    assert p.next_deadline(0.05) is None
    assert [r for t in (1.0, 1.01, 1.02) for r in _arrive(p, t)] == []
    assert p.next_deadline(1.02) == pytest.approx(1.05)
    assert _arrive(p, 1.03) == [Release(4)]
    assert p.next_deadline(1.03) is None


def test_fixed_timeout_is_capped_by_max_wait_and_chunks_a_burst():
    p = FixedTimeout(_cfg("fixed_timeout", max_batch=4, timeout_s=5.0, max_wait_s=0.5))
    for _ in range(10):
        p.observe(Arrival("x"), 2.0)
    assert p.next_deadline(2.0) == 2.0
    assert p.decide(2.0) == [Release(4), Release(4)]
    assert p.next_deadline(2.0) == 2.5
    assert p.decide(2.5) == [Release(2)]


def test_queue_length_trigger_and_hard_cap():
    p = QueueLengthTrigger(_cfg("queue_length", max_batch=8, queue_length=3, max_wait_s=1.0))
    assert _arrive(p, 0.0) == [] and _arrive(p, 0.2) == []
    assert p.next_deadline(0.2) == 1.0  # A after the first, nothing else would release them
    assert _arrive(p, 0.3) == [Release(3)]
    assert p.next_deadline(0.3) is None
    assert _arrive(p, 5.0) == []
    assert p.decide(5.999) == [] and p.decide(6.0) == [Release(1)]


def test_queue_length_is_capped_at_max_batch_and_releases_what_is_queued():
    p = QueueLengthTrigger(_cfg("queue_length", max_batch=2, queue_length=10))
    assert p.threshold == 2
    assert _arrive(p, 0.0) == [] and _arrive(p, 0.1) == [Release(2)]
    q = QueueLengthTrigger(_cfg("queue_length", max_batch=8, queue_length=3))
    for _ in range(7):
        q.observe(Arrival("x"), 0.0)
    assert q.decide(0.0) == [Release(7)]


# --- adaptive -------------------------------------------------------------------------------------------


def _warm(policy: AdaptiveMicroBatch, rate: float, n: int, start: float = 0.0) -> float:
    """n arrivals evenly spaced at `rate`, whatever they release; returns the last arrival time."""
    t = start
    for k in range(n):
        t = start + k / rate
        _arrive(policy, t)
    return t


def test_adaptive_releases_at_once_while_rate_unknown():
    p = AdaptiveMicroBatch(_cfg(max_batch=8, min_samples=3))
    assert p.rate is None and p.idle_threshold is None
    assert _arrive(p, 0.0) == [Release(1)]
    assert _arrive(p, 0.01) == [Release(1)]
    assert p.next_deadline(0.01) is None
    assert _arrive(p, 0.02) == []  # third sample: λ known, the batch is held
    assert p.rate == pytest.approx(100.0)
    assert p.idle_threshold == pytest.approx(p.kappa / 100.0)


def test_adaptive_size_trigger():
    p = AdaptiveMicroBatch(_cfg(max_batch=4, min_samples=2))
    _arrive(p, 0.0)  # released alone: λ unknown
    got = [_arrive(p, k * 0.01) for k in range(1, 5)]
    assert got == [[], [], [], [Release(4)]]  # g = κ·0.01 ≈ 0.0185 s > gap, so only B releases
    assert p.next_deadline(0.04) is None


def test_adaptive_idle_trigger_since_last_arrival():
    p = AdaptiveMicroBatch(_cfg(max_batch=8, min_samples=3, max_wait_s=1.0))
    last = _warm(p, rate=10.0, n=30)
    flush = p.next_deadline(last)
    p.decide(flush)
    assert p.queued == 0
    t0 = flush + 0.01
    assert _arrive(p, t0) == []
    t1 = t0 + 0.5 * p.idle_threshold
    assert _arrive(p, t1) == []
    g = p.idle_threshold
    assert g == pytest.approx(p.kappa / p.rate)
    assert p.next_deadline(t1) == t1 + g  # measured from the LAST arrival
    assert p.decide(t1 + g - 1e-6) == []
    assert p.decide(t1 + g) == [Release(2)]
    assert p.next_deadline(t1 + g) is None


def test_adaptive_hard_cap_cuts_the_pathological_stream():
    """Each request lands just before g: only A releases the batch, and nobody waits longer than A."""
    a, b = 1.0, 64
    p = AdaptiveMicroBatch(_cfg(max_batch=b, min_samples=3, max_wait_s=a, rate_window_s=10.0))
    last = _warm(p, rate=100.0, n=100)
    flush = p.next_deadline(last)
    p.decide(flush)
    first = t = flush + 1.0
    assert _arrive(p, first) == []
    n = 1
    while True:
        nxt = t + 0.99 * p.idle_threshold
        due = p.next_deadline(t)
        if due <= nxt:
            break
        assert p.decide(nxt - 1e-9) == []  # the idle trigger never fires on its own
        t = nxt
        assert _arrive(p, t) == []
        n += 1
    assert due == first + a
    assert 1 < n < b
    assert p.decide(due) == [Release(n)]


def test_adaptive_idle_threshold_follows_rate_drift():
    """λ from 2/s to 10/s and back: g tightens, then relaxes to κ/2 once the window has drifted."""
    p = AdaptiveMicroBatch(_cfg(max_batch=8, min_samples=3, rate_window_s=5.0))
    slow1 = [k * 0.5 for k in range(21)]  # 0..10 s at 2/s
    fast = [10.0 + k * 0.1 for k in range(1, 101)]  # to 20 s at 10/s
    slow2 = [20.0 + k * 0.5 for k in range(1, 21)]  # to 30 s at 2/s
    g: dict[float, float] = {}
    _run(p, slow1 + fast + slow2, 8, on_arrival=lambda pol, now: g.__setitem__(now, pol.idle_threshold))
    assert g[10.0] == pytest.approx(p.kappa / 2.0)
    assert g[20.0] == pytest.approx(p.kappa / 10.0)  # tightened: higher λ, shorter wait
    assert g[30.0] == pytest.approx(p.kappa / 2.0)  # relaxed again
    relaxing = [g[t] for t in slow2]
    assert all(x <= y + EPS for x, y in itertools.pairwise(relaxing))  # grows steadily as fast arrivals age out
    assert relaxing[0] < relaxing[-1]


def test_adaptive_with_max_batch_one_is_pass_through():
    p = AdaptiveMicroBatch(_cfg(max_batch=1, min_samples=2))
    assert p.kappa == 0.0
    assert [_arrive(p, t) for t in (0.0, 0.1, 0.2, 0.2)] == [[Release(1)]] * 4
    assert p.idle_threshold == 0.0 and p.next_deadline(0.2) is None


# --- registry and invariants over random traces ---------------------------------------------------------


@pytest.mark.parametrize("name", ["adaptive", "fixed_timeout", "queue_length"])
def test_work_conserving_releases_to_an_idle_encoder_and_holds_only_while_it_works(name):
    p = make_batch_policy(_cfg(name, max_batch=4, min_samples=2, max_wait_s=1.0, timeout_s=1.0, queue_length=4,
                               work_conserving=True))
    assert _arrive(p, 0.0) == [Release(1)]            # idle encoder: out at once, whatever the rule says
    assert _arrive(p, 0.01) == [] and _arrive(p, 0.02) == []  # busy: the rule holds them (B = 4 not reached)
    assert p.next_deadline(0.02) > 0.02                # ... until its own deadline, not "now"
    p.encoder_idle(0.03)                               # the encoder's stream ran empty
    assert p.next_deadline(0.03) == 0.03 and p.decide(0.03) == [Release(2)]
    got = [_arrive(p, 0.04 + k * 0.001) for k in range(4)]  # busy again: a burst fills B by the size trigger
    assert got == [[], [], [], [Release(4)]]
    p.encoder_idle(0.05)
    assert p.decide(0.05) == [] and p.next_deadline(0.05) is None  # nothing waits; the next arrival goes out
    assert _arrive(p, 0.06) == [Release(1)]


def test_without_work_conserving_an_idle_encoder_changes_nothing():
    p = AdaptiveMicroBatch(_cfg(max_batch=4, min_samples=2))
    _arrive(p, 0.0)
    assert _arrive(p, 0.01) == []
    p.encoder_idle(0.02)
    assert p.decide(0.02) == [] and p.next_deadline(0.02) > 0.02
    pt = PassThrough()
    pt.encoder_idle(0.0)
    assert _arrive(pt, 0.0) == [Release(1)]


def test_registry_maps_every_configured_name():
    assert set(BATCH_POLICIES) == {"pass_through", "fixed_timeout", "queue_length", "adaptive"}
    kinds = {"pass_through": PassThrough, "fixed_timeout": FixedTimeout,
             "queue_length": QueueLengthTrigger, "adaptive": AdaptiveMicroBatch}
    for name, cls in kinds.items():
        policy = make_batch_policy(_cfg(name, max_batch=3))
        assert isinstance(policy, cls) and policy.cfg.max_batch == 3
    assert make_batch_policy(_cfg("adaptive")) is not make_batch_policy(_cfg("adaptive"))


def _random_trace(rng: random.Random) -> list[float]:
    """Poisson phases at drifting rates, idle gaps, and bursts of simultaneous arrivals."""
    out, t = [], 0.0
    for _ in range(rng.randint(2, 6)):
        kind = rng.random()
        if kind < 0.2:
            t += rng.uniform(0.5, 15.0)  # idle
        elif kind < 0.35:
            out += [t] * rng.randint(2, 20)  # burst at one instant
        else:
            phase = _poisson(rng, rng.choice([0.5, 2.0, 10.0, 50.0, 300.0]), t, rng.uniform(0.5, 5.0))
            out += phase
            t = phase[-1] if phase else t + 1.0
    return out


def _random_cfg(rng: random.Random, name: str) -> BatchPolicyConfig:
    return _cfg(name, max_batch=rng.choice([1, 2, 3, 4, 8, 16, 32]), fill_probability=rng.uniform(0.3, 0.9),
                max_wait_s=rng.choice([0.01, 0.1, 1.0]), timeout_s=rng.choice([0.005, 0.05, 2.0]),
                queue_length=rng.randint(1, 40), rate_window_s=rng.choice([0.5, 5.0, 10.0]),
                min_samples=rng.randint(2, 6), work_conserving=rng.random() < 0.4)


@pytest.mark.parametrize("name", sorted(BATCH_POLICIES))
@pytest.mark.parametrize("seed", range(25))
def test_invariants_over_random_traces(name, seed):
    rng = random.Random(f"{name}-{seed}")
    cfg = _random_cfg(rng, name)
    arrivals = _random_trace(rng)
    policy = make_batch_policy(cfg)
    lazy = rng.random() < 0.5
    signals = random.Random(seed + 1000)

    def idle_now_and_then(p: BatchPolicy, now: float) -> None:  # the encoder's stream ran empty, at random
        if signals.random() < 0.3:
            p.encoder_idle(now)

    trace = _run(policy, arrivals, cfg.max_batch, rng=random.Random(seed) if lazy else None,
                 on_arrival=idle_now_and_then)
    assert len(trace.waits) == len(arrivals)  # everything released exactly once
    assert sum(c for _, c in trace.releases) == len(arrivals)
    assert all(0.0 <= w <= cfg.max_wait_s + EPS for w in trace.waits), max(trace.waits, default=0.0)
    if name == "pass_through":
        assert all(c == 1 for _, c in trace.releases)
    if name == "fixed_timeout":
        assert all(w <= min(cfg.timeout_s, cfg.max_wait_s) + EPS for w in trace.waits)
