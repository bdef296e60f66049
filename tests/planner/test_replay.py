"""The live trial's replayer: judging records like the simulator does, and an open-loop replay (plus a
whole live trial through LiveBackend's default replayer) against a small local cluster."""

from __future__ import annotations

import math

import httpx
import pytest

from coordinator.planner.allocation import parse_allocation
from coordinator.planner.goodput import SLO, RequestRecord
from coordinator.planner.live import LiveBackend
from coordinator.planner.live_http import LiveClusterError
from coordinator.planner.replay import HttpReplayer, ReplayRecord, summarize_replay
from coordinator.planner.space import Knobs, TrialConfig
from coordinator.planner.ttft_stages import STAGES, live_stages, sim_stages
from coordinator.planner.workload import (
    ArrivalProcess,
    RequestClass,
    SimRequest,
    Uniform,
    Workload,
)

SLO_ = SLO(ttft_s=0.5, tpot_s=0.2)


def record(i: int, sent: float, ttft: float, e2e: float, tokens: int, error: str | None = None) -> ReplayRecord:
    r = ReplayRecord(SimRequest(i, sent, "image", 1, 196, 20, tokens), sent=sent, output_tokens=tokens, error=error)
    if error is None:
        r.ttft, r.e2e = ttft, e2e
    return r


def test_summary_counts_failures_but_never_as_good():
    records = [record(0, 0.0, 0.1, 0.5, 5), record(1, 1.0, 0.6, 0.8, 5),            # TTFT too slow
               record(2, 2.0, 0.1, 2.0, 5), record(3, 2.5, 0, 0, 5, error="HTTP 500")]  # TPOT 0.475: too slow
    s = summarize_replay(records, SLO_, mean_encode_batch=1.0)
    assert (s.requests, s.good) == (4, 1) and s.slo_attainment == 0.25
    assert s.duration_s == pytest.approx(4.0)                      # first send to the last finish
    assert s.goodput_rps == pytest.approx(0.25) and s.throughput_rps == pytest.approx(0.75)
    assert records[0].tpot == pytest.approx(0.1) and s.mean_encode_batch == 1.0
    with pytest.raises(LiveClusterError, match=r"all 1 replayed requests failed, e.g. \['HTTP 500'\]"):
        summarize_replay([records[3]], SLO_)


def test_one_token_answers_have_no_tpot():
    assert record(0, 0.0, 0.1, 0.1, 1).tpot == 0.0 and math.isnan(ReplayRecord(SimRequest(0, 0, "image", 1, 1, 1, 2)).ttft)


def test_ttft_stages_add_up_to_the_mean_ttft_live_and_simulated():
    live = [record(0, 0.0, 0.100, 0.5, 5), record(1, 1.0, 0.200, 0.8, 5), record(2, 2.0, 0, 0, 5, error="HTTP 500"),
            record(3, 3.0, 0.300, 0.9, 5)]
    live[0].marks = {"encode_start": 0.010, "encode_end": 0.030, "first_token": 0.090}
    live[1].marks = {"encode_start": 0.050, "encode_end": 0.070, "first_token": 0.180}   # record 3: no marks (foreign)
    st = live_stages(live)
    assert st["requests"] == 2
    assert [round(st[k], 6) for k in STAGES] == [0.030, 0.020, 0.085, 0.015]
    assert live_stages(live[2:]) == {}
    sim = [RequestRecord(SimRequest(0, 1.0, "image", 1, 196, 20, 4), encode_start=1.01, encode_end=1.05,
                         first_token=1.2),
           RequestRecord(SimRequest(1, 2.0, "image", 1, 196, 20, 4))]                 # never got a token
    st = sim_stages(sim)
    assert st["requests"] == 1 and [round(st[k], 6) for k in STAGES] == [0.01, 0.04, 0.15, 0.0]


def test_only_image_workloads_replay():
    video = [SimRequest(0, 0.0, "video", 1, 64, 10, 4)]
    with pytest.raises(LiveClusterError, match=r"image requests only.*\['video'\]"):
        HttpReplayer("http://127.0.0.1:9").run(video)
    with pytest.raises(ValueError, match="empty"):
        HttpReplayer("http://127.0.0.1:9").run([])


WORKLOAD = Workload(arrivals=ArrivalProcess(rate=5.0), mix=[RequestClass(
    tokens_per_item=196, prompt_tokens=Uniform(low=8, high=40), output_tokens=Uniform(low=2, high=6))])


@pytest.mark.slow
@pytest.mark.redis
def test_open_loop_replay_keeps_the_workloads_lengths(live_cluster):
    requests = WORKLOAD.generate(6, seed=3)
    done = []
    replayer = HttpReplayer(live_cluster.url, on_done=done.append)
    records, _ = replayer.run(requests)
    assert len(done) == 6 and all(r.ok for r in records), [r.error for r in records]
    for r in records:
        assert r.prompt_tokens == r.request.prompt_tokens and r.output_tokens == r.request.output_tokens
        assert 0 < r.ttft <= r.e2e and r.tpot >= 0
        assert 0 < r.marks["encode_start"] < r.marks["encode_end"] < r.marks["first_token"] < r.ttft  # usage chunk
    stages = live_stages(records)
    assert stages["requests"] == 6 and all(stages[k] > 0 for k in STAGES)
    assert sum(stages[k] for k in STAGES) == pytest.approx(sum(r.ttft for r in records) / 6)
    sends = [r.sent for r in records]
    offsets = [q.arrival - requests[0].arrival for q in requests]
    assert all(abs((s - sends[0]) - o) < 0.05 for s, o in zip(sends, offsets))   # open loop: sent on schedule
    summary = summarize_replay(records, SLO(ttft_s=30, tpot_s=5))
    assert summary.good == 6 and summary.goodput_rps > 0


@pytest.mark.slow
@pytest.mark.redis
def test_a_live_trial_end_to_end(live_cluster):
    deployed = parse_allocation("1xcpu:E,1xcpu:P+D")
    with httpx.Client(base_url=live_cluster.url, timeout=30) as client:
        backend = LiveBackend(client, deployed, cost_per_hour=1.0, workload=WORKLOAD, slo=SLO(ttft_s=30, tpot_s=5),
                              requests=5, seed=1, settle_s=0.0)
        assert isinstance(backend.replayer, HttpReplayer) and backend.replayer.url == live_cluster.url
        outcome = backend.evaluate(TrialConfig(allocation=deployed, knobs=Knobs(batch=2)))
        policy = client.get("/v1/admin/policy").json()
    assert outcome.backend == "live" and outcome.requests == 5 and outcome.slo_attainment == 1.0
    assert outcome.objective == pytest.approx(outcome.goodput_rps * 3600) and outcome.ttft_mean_s > 0
    assert policy["batch"]["name"] == "adaptive" and policy["batch"]["max_batch"] == 2
