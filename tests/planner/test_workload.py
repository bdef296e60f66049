"""Workload generation (arrival processes, request mix, distributions) and the goodput summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.planner.goodput import SLO, NodeUsage, RequestRecord, summarize
from coordinator.planner.workload import (ArrivalProcess, Choice, Fixed, LogNormal, RequestClass, SimRequest,
                                          Uniform, Workload)


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


@pytest.mark.parametrize("process, want_cv", [({"kind": "poisson"}, 1.0), ({"kind": "gamma", "cv": 2.0}, 2.0),
                                              ({"kind": "gamma", "cv": 0.5}, 0.5), ({"kind": "gamma", "cv": 1.0}, 1.0)])
def test_arrival_rate_and_cv_over_10000_gaps(process, want_cv):
    arrivals = ArrivalProcess(rate=5.0, **process)
    gaps = arrivals.gaps(np.random.default_rng(3), 10_000)
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.05)
    assert cv(gaps) == pytest.approx(want_cv, rel=0.06)
    times = arrivals.times(np.random.default_rng(3), 10_000)
    assert np.all(np.diff(times) >= 0) and times[0] > 0
    assert len(times) / times[-1] == pytest.approx(5.0, rel=0.05)


def test_poisson_with_another_cv_is_refused_naming_the_value():
    with pytest.raises(ValidationError, match="cv=2.0"):
        ArrivalProcess(rate=1.0, cv=2.0)
    with pytest.raises(ValidationError):
        ArrivalProcess(rate=0.0)


def test_generate_is_deterministic_per_seed_and_in_arrival_order():
    w = Workload(arrivals=ArrivalProcess(rate=3.0), mix=[RequestClass(output_tokens=Uniform(low=1, high=50))])
    a, b, c = w.generate(500, seed=7), w.generate(500, seed=7), w.generate(500, seed=8)
    assert a == b and a != c
    assert [r.request_id for r in a] == list(range(500))
    assert all(x.arrival <= y.arrival for x, y in zip(a, a[1:]))
    assert w.generate(500, np.random.default_rng(7)) == a  # a Generator works like its seed


def test_mix_weights_and_fields():
    w = Workload(arrivals=ArrivalProcess(rate=1.0), mix=[
        RequestClass(modality="image", weight=3, items=2, tokens_per_item=576, prompt_tokens=10, output_tokens=5),
        RequestClass(modality="audio", weight=1, tokens_per_item=Choice(values=[100, 300]), prompt_tokens=0),
    ])
    reqs = w.generate(8000, seed=1)
    images = [r for r in reqs if r.modality == "image"]
    assert len(images) / len(reqs) == pytest.approx(0.75, abs=0.02)
    r = images[0]
    assert (r.items, r.tokens_per_item, r.text_tokens, r.output_tokens) == (2, 576, 10, 5)
    assert r.embedding_tokens == 1152 and r.prompt_tokens == 1162
    audio = {r.tokens_per_item for r in reqs if r.modality == "audio"}
    assert audio == {100, 300}


@pytest.mark.parametrize("dist, low, high, mean", [
    (Fixed(value=7), 7, 7, 7.0), (Uniform(low=3, high=9), 3, 9, 6.0),
    (Choice(values=[1, 10], weights=[3, 1]), 1, 10, 3.25), (LogNormal(mean=100, cv=0.5), 1, None, 100.0),
])
def test_distributions(dist, low, high, mean):
    x = dist.sample(np.random.default_rng(0), 20_000)
    assert x.dtype == np.int64 and x.min() >= low and (high is None or x.max() <= high)
    assert x.mean() == pytest.approx(mean, rel=0.03)


def test_plain_int_means_fixed_and_bad_distributions_are_refused():
    assert RequestClass(prompt_tokens=12).prompt_tokens == Fixed(value=12)
    with pytest.raises(ValidationError, match="output_tokens must never be below 1.*allows 0"):
        RequestClass(output_tokens=Uniform(low=0, high=4))
    with pytest.raises(ValidationError, match="low=5 high=2"):
        Uniform(low=5, high=2)
    with pytest.raises(ValidationError, match="weights"):
        Choice(values=[1, 2], weights=[1.0])
    with pytest.raises(ValueError, match="n=-1"):
        Workload(arrivals=ArrivalProcess(rate=1.0)).generate(-1)


def record(arrival: float, first: float, finish: float, out: int, batch: int = 1) -> RequestRecord:
    req = SimRequest(0, arrival, "image", 1, 10, 10, out)
    return RequestRecord(req, encode_batch=batch, first_token=first, finish=finish)


def test_summary_goodput_latency_utilisation_and_cost():
    records = [record(0.0, 0.5, 1.5, 11),    # ttft 0.5, tpot 0.1: good
               record(1.0, 2.5, 3.0, 11),    # ttft 1.5: bad
               record(2.0, 2.2, 6.0, 11),    # tpot 0.38: bad
               record(3.0, 3.1, 3.1, 1)]     # one token: tpot 0, good
    usage = [NodeUsage("e", "l4", "E", busy_s=3.0, stages=frozenset({"encode"})),
             NodeUsage("pd", "a100", "P+D", busy_s=6.0, stages=frozenset({"prefill", "decode"}))]
    usage[0].stage_busy_s["encode"] = 3.0
    usage[1].stage_busy_s.update(prefill=1.2, decode=4.8)
    s = summarize(records, SLO(ttft_s=1.0, tpot_s=0.2), usage, {"e": 1.0, "pd": 3.0})
    assert (s.requests, s.good, s.duration_s) == (4, 2, 6.0)
    assert s.goodput_rps == pytest.approx(2 / 6) and s.throughput_rps == pytest.approx(4 / 6)
    assert s.slo_attainment == 0.5
    assert s.node_utilisation == {"e": 0.5, "pd": 1.0}
    assert s.stage_utilisation == pytest.approx({"encode": 0.5, "prefill": 0.2, "decode": 0.8})
    assert s.cost_per_hour == 4.0
    assert s.cost_per_goodput == pytest.approx(4.0 / (2 / 6 * 3600))
    assert s.ttft_p50_s == pytest.approx(0.35)


def test_summary_refuses_missing_prices_and_unfinished_requests():
    usage = [NodeUsage("e", "l4", "E")]
    with pytest.raises(ValueError, match=r"no \$/h for nodes \['e'\]"):
        summarize([record(0, 1, 2, 2)], SLO(ttft_s=1, tpot_s=1), usage, {"x": 1.0})
    with pytest.raises(ValueError, match="never finished"):
        summarize([record(0, 1, math.nan, 2)], SLO(ttft_s=1, tpot_s=1), usage)
    no_good = summarize([record(0, 5, 6, 2)], SLO(ttft_s=1, tpot_s=1), usage, {"e": 1.0})
    assert no_good.goodput_rps == 0 and no_good.cost_per_goodput == math.inf
