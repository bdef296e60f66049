"""TPOT, goodput and cost arithmetic against records computed by hand."""

from __future__ import annotations

import pytest

from benchmarks.bench.client import RequestRecord, timings
from benchmarks.bench.cost import Cost, CostError, per_1k_good, per_1m_tokens, price_gpus, resolve_costs
from benchmarks.bench.slo import SLO
from benchmarks.bench.summary import judge, summarize


def test_timings_from_chunk_stamps():
    # sent at 10.0; content chunks at 10.3, 10.4, 10.6; stream ends at 10.7; the usage chunk says 5 tokens
    t = timings(10.0, [10.3, 10.4, 10.6], 10.7, 5)
    assert t["ttft_s"] == pytest.approx(0.3)
    assert t["e2e_s"] == pytest.approx(0.7)
    assert t["tpot_s"] == pytest.approx((0.7 - 0.3) / 4)  # (E2E - TTFT) / (tokens - 1)
    assert t["itl_s"] == pytest.approx([0.1, 0.2])
    assert timings(0.0, [0.2], 0.25, 1)["tpot_s"] is None  # one token: no TPOT


def rec(i, ok=True, ttft=None, tpot=None, e2e=None, tokens=0, err=None):
    return RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, ok=ok, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
                         output_tokens=tokens, error_type=err, itl_s=[])


RECORDS = [
    rec(0, ttft=0.2, tpot=0.020, e2e=1.0, tokens=41),   # good
    rec(1, ttft=0.6, tpot=0.010, e2e=1.0, tokens=41),   # TTFT misses 500 ms
    rec(2, ttft=0.1, tpot=0.060, e2e=2.5, tokens=41),   # TPOT misses 50 ms
    rec(3, ttft=0.4, tpot=None, e2e=0.4, tokens=1),     # good: one token has no TPOT
    rec(4, ok=False, err="http_500"),
    rec(5, ok=False, err="timeout"),
    rec(6, ok=False, err="http_500"),
    rec(7, ttft=0.5, tpot=0.050, e2e=2.45, tokens=40),  # good, exactly on both targets
]


def test_goodput_and_attainment_by_hand():
    judge(RECORDS, SLO(ttft_ms=500, tpot_ms=50))
    assert [r.good for r in RECORDS] == [True, False, False, True, False, False, False, True]
    s = summarize(RECORDS, wall_s=4.0, slo=SLO(ttft_ms=500, tpot_ms=50), cost=Cost(per_hour=3.6, source="test"))
    assert (s["requests"], s["completed"], s["failed"], s["good"]) == (8, 5, 3, 3)
    assert s["errors"] == {"http_500": 2, "timeout": 1}
    assert s["goodput_rps"] == pytest.approx(3 / 4.0)
    assert s["throughput_rps"] == pytest.approx(5 / 4.0)
    assert s["slo_attainment"] == pytest.approx(3 / 8)
    assert s["output_tokens"] == 41 * 3 + 1 + 40
    assert s["output_tokens_per_s"] == pytest.approx(164 / 4.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(400.0)  # nearest rank of [100, 200, 400, 500, 600]
    assert s["tpot_ms"]["mean"] == pytest.approx(35.0)  # mean of 20, 10, 60, 50
    # $3.6/h at 0.75 good req/s = 2,700 good req/h -> $1.3333 per 1k; 41 tok/s -> $24.39 per 1M tokens
    assert s["cost_per_1k_good"] == pytest.approx(3.6 / 2700 * 1000, rel=1e-5)
    assert s["cost_per_1m_output_tokens"] == pytest.approx(3.6 / (41 * 3600) * 1e6, rel=1e-5)


def test_no_slo_counts_every_completed_request():
    judge(RECORDS, None)
    assert sum(r.good for r in RECORDS) == 5


def test_cost_formulas_and_zero_denominators():
    assert per_1k_good(7.2, 2.0) == pytest.approx(1.0)  # 7,200 good req/h for $7.2/h
    assert per_1m_tokens(3.6, 1000.0) == pytest.approx(1.0)  # 3.6 M tokens/h for $3.6/h
    assert per_1k_good(7.2, 0.0) is None and per_1m_tokens(7.2, 0.0) is None
    s = summarize([rec(0, ok=False, err="timeout")], 1.0, None, Cost(per_hour=1.0, source="t"))
    assert s["cost_per_1k_good"] is None and s["goodput_rps"] == 0.0


def test_gpus_are_priced_from_the_planner_catalog():
    from coordinator.planner.catalog import load_catalog

    cat = load_catalog()
    cost = price_gpus("2xRTX4090,2xA100", [])
    assert cost.per_hour == pytest.approx(2 * cat.tier("RTX4090").price_per_hour + 2 * cat.tier("A100").price_per_hour)
    assert "RTX4090" in cost.source and "A100-80GB" in cost.source


def test_costs_per_system():
    costs = resolve_costs(["a", "b"], ["2.5", "b=1"], [], [])
    assert costs["a"].per_hour == 2.5 and costs["b"].per_hour == 1.0
    assert resolve_costs(["a"], [], [], []) == {}
    for bad, needle in ((["x=1"], "no system 'x'"), (["1", "2"], "already given"), (["a=-1"], ">= 0"),
                        (["a=inf"], "finite"), (["cheap"], "not a number")):
        with pytest.raises(CostError, match=needle):
            resolve_costs(["a"], bad, [], [])
    with pytest.raises(CostError, match="unknown GPU tier"):
        resolve_costs(["a"], [], ["2xNOPE"], [])
