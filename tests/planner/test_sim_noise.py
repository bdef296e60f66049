"""Host noise in the simulator (coordinator/planner/sim_noise.py): a host-speed factor per window of simulated time
on the compute stages, reproducible, median 1, and nothing else touched."""

from __future__ import annotations

import math
import statistics

import pytest

from coordinator.planner.deployment import Deployment
from coordinator.planner.sim import Simulator
from coordinator.planner.sim_noise import HostNoise, HostSpeed, HostTrace, NoisyService
from tests.planner.test_sim import Table, workload


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_factor_is_constant_within_a_window_and_drawn_anew_for_the_next():
    clock = Clock()
    speed = HostSpeed(HostNoise(sigma=0.3, period_s=0.05, seed=7), clock)
    clock.now = 0.101
    first = speed.factor()
    clock.now = 0.149
    assert speed.factor() == first  # same window [0.10, 0.15)
    clock.now = 0.151  # (0.150 / 0.05 is 2.9999... in floating point: the boundary itself is not tested)
    assert speed.factor() != first


def test_a_window_s_factor_depends_on_the_seed_and_the_window_only():
    windows = [3, 0, 7, 1, 3]
    forward, backward, other = Clock(), Clock(), Clock()
    a = HostSpeed(HostNoise(0.2, 1.0, seed=1), forward)
    b = HostSpeed(HostNoise(0.2, 1.0, seed=1), backward)
    c = HostSpeed(HostNoise(0.2, 1.0, seed=2), other)
    got_a, got_b = {}, {}
    for w in windows:
        forward.now = w + 0.5
        got_a[w] = a.factor()
    for w in reversed(windows):
        backward.now = w + 0.5
        got_b[w] = b.factor()
    other.now = 3.5
    assert got_a == got_b  # asked in another order, the same factors
    assert c.factor() != got_a[3]


def test_the_factor_is_lognormal_with_median_one_and_the_given_spread():
    clock = Clock()
    speed = HostSpeed(HostNoise(sigma=0.25, period_s=1.0, seed=3), clock)
    logs = []
    for w in range(4000):
        clock.now = w + 0.5
        logs.append(math.log(speed.factor()))
    assert abs(statistics.median(logs)) < 0.02
    assert statistics.pstdev(logs) == pytest.approx(0.25, rel=0.05)


def test_no_spread_is_no_noise():
    clock = Clock()
    speed = HostSpeed(HostNoise(sigma=0.0, period_s=0.05), clock)
    for t in (0.0, 0.07, 13.2):
        clock.now = t
        assert speed.factor() == 1.0


@pytest.mark.parametrize("bad", [dict(sigma=-0.1, period_s=0.05), dict(sigma=math.nan, period_s=0.05),
                                 dict(sigma=0.2, period_s=0.0), dict(sigma=0.2, period_s=math.inf)])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        HostNoise(**bad)


class WithHops(Table):
    def request_hops_s(self):
        return 0.002, 0.003


def test_only_the_compute_stages_are_scaled():
    clock = Clock()
    speed = HostSpeed(HostNoise(sigma=0.5, period_s=1.0, seed=5), clock)
    clock.now = 0.5
    f = speed.factor()
    table = WithHops(encode=0.010, prefill=0.020, decode=0.005, transfer=0.001)
    noisy = NoisyService(table, speed)
    assert noisy.encode_s("l4", "image", 1, 64) == pytest.approx(0.010 * f)
    assert noisy.prefill_s("a100", 100) == pytest.approx(0.020 * f)
    assert noisy.decode_step_s("a100", 4, 400) == pytest.approx(0.005 * f)
    assert noisy.transfer_s(1000, "l4", "a100", False) == 0.001
    assert noisy.request_hops_s() == (0.002, 0.003)  # the optional extras pass through


def _simulate(noise: HostNoise | None):
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    sim = Simulator(Deployment.parse("E@l4, P+D@a100"), table, kv_bytes_per_token=1000,
                    embedding_bytes_per_token=100, host_noise=noise)
    return sim.run(workload(0.2).generate(300, seed=1)).records


def test_the_simulator_spreads_latencies_with_noise_and_not_without():
    plain = sorted(r.ttft for r in _simulate(None))
    zero = sorted(r.ttft for r in _simulate(HostNoise(sigma=0.0, period_s=0.05)))
    noisy = sorted(r.ttft for r in _simulate(HostNoise(sigma=0.25, period_s=0.05, seed=1)))
    assert zero == plain
    q = lambda xs, p: xs[int(p * (len(xs) - 1))]  # noqa: E731
    assert q(plain, 0.9) / q(plain, 0.1) == pytest.approx(1.0, abs=1e-6)  # low load: every TTFT the same
    assert q(noisy, 0.9) / q(noisy, 0.1) > 1.3
    assert statistics.median(noisy) == pytest.approx(statistics.median(plain), rel=0.1)
    again = sorted(r.ttft for r in _simulate(HostNoise(sigma=0.25, period_s=0.05, seed=1)))
    assert again == noisy


def test_a_trace_gives_each_stage_its_window_s_measured_factor_and_holds_the_last():
    clock = Clock()
    trace = HostTrace(window_s=2.0, encode=(1.0, 1.5), llm=(0.8, 1.2, 2.0))
    speed = HostSpeed(None, clock, trace=trace)
    table = Table(encode=0.010, prefill=0.020, decode=0.005, transfer=0.001)
    traced = NoisyService(table, speed)
    for now, enc, llm in ((-0.5, 1.0, 0.8), (1.9, 1.0, 0.8), (2.1, 1.5, 1.2), (4.5, 1.5, 2.0), (99.0, 1.5, 2.0)):
        clock.now = now
        assert traced.encode_s("l4", "image", 1, 64) == pytest.approx(0.010 * enc)
        assert traced.prefill_s("a100", 100) == pytest.approx(0.020 * llm)
        assert traced.decode_step_s("a100", 4, 400) == pytest.approx(0.005 * llm)
        assert traced.transfer_s(1000, "l4", "a100", False) == 0.001
    noisy = HostSpeed(HostNoise(sigma=0.3, period_s=1.0, seed=2), clock, trace=trace)
    alone = HostSpeed(HostNoise(sigma=0.3, period_s=1.0, seed=2), clock)
    clock.now = 4.5
    assert noisy.factor("llm") == pytest.approx(2.0 * alone.factor("llm"))  # both: the product


@pytest.mark.parametrize("bad", [dict(window_s=0.0, encode=(1.0,), llm=(1.0,)),
                                 dict(window_s=1.0, encode=(), llm=(1.0,)),
                                 dict(window_s=1.0, encode=(1.0,), llm=(1.0, -0.5)),
                                 dict(window_s=1.0, encode=(math.nan,), llm=(1.0,))])
def test_bad_traces_are_refused(bad):
    with pytest.raises(ValueError):
        HostTrace(**bad)


def test_the_simulator_follows_a_trace():
    """Decode twice as slow in the second half of the run: those requests' TPOT doubles, the first half's does not."""
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    reqs = workload(0.2).generate(40, seed=1)
    half = reqs[-1].arrival / 2

    def run(trace):
        sim = Simulator(Deployment.parse("E@l4, P+D@a100"), table, kv_bytes_per_token=1000,
                        embedding_bytes_per_token=100, host_trace=trace)
        return sim.run(reqs).records

    plain = run(None)
    traced = run(HostTrace(window_s=half, encode=(1.0,), llm=(1.0, 2.0)))
    for p, t in zip(plain, traced):
        if t.finish < half:
            assert t.tpot == pytest.approx(p.tpot)
        elif t.first_token > half + 0.5:
            assert t.tpot == pytest.approx(2 * p.tpot, rel=0.05)
    assert any(t.first_token > half + 0.5 for t in traced) and any(t.finish < half for t in traced)
