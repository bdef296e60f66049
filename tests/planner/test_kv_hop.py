"""The KV hand-off's measured latency (ProfileOverheads.kv_hop_s): PerfModel times a prefill worker's KV cache to a
decode worker with it, and only that (embeddings keep hop_s); the simulator's P -> D hand-off reads it; profiles
pool it only when each has it; and profiling_handoff.py times it on a real cluster with a prefill/decode pair."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.catalog import load_catalog
from coordinator.planner.live_http import LiveClusterError
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import ProfileOverheads, pool_profiles
from coordinator.planner.profiling_handoff import check_pair, measure_kv_hop, with_kv_hop
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port
from tests.planner.overhead_profiles import TINY, profile, run


def test_kv_transfers_take_the_measured_kv_hop_and_embeddings_keep_hop_s():
    nbytes = 206 * TINY.kv_bytes_per_token()
    wire = nbytes / PerfModel(load_catalog(), TINY, [profile()]).link_bytes_s("cpu", "cpu", False)
    measured = PerfModel(load_catalog(), TINY, [profile(hop_s=0.0014, kv_hop_s=0.0037)])
    assert measured.kv_transfer_s(nbytes, "cpu", "cpu", False) == pytest.approx(wire + 0.0037)
    assert measured.transfer_s(nbytes, "cpu", "cpu", False) == pytest.approx(wire + 0.0014)
    unmeasured = PerfModel(load_catalog(), TINY, [profile(hop_s=0.0014)])      # kv_hop_s None: the old reading
    assert unmeasured.kv_transfer_s(nbytes, "cpu", "cpu", False) == unmeasured.transfer_s(nbytes, "cpu", "cpu", False)
    assert measured.kv_transfer_s(0, "cpu", "cpu", False) == 0.0
    slow = PerfModel(load_catalog(), TINY, [profile(hop_s=0.0014, kv_hop_s=0.0037)])
    slow.slowdown = 2.0
    assert slow.kv_transfer_s(nbytes, "cpu", "cpu", False) == pytest.approx(2 * (wire + 0.0037))


def test_the_simulated_hand_off_to_the_decode_worker_takes_the_kv_hop():
    """One request at a time: on E, P, D its decode starts later by exactly the KV hop's difference (TTFT
    unchanged); with no hand-off (E, P+D) nothing moves."""
    requests = [SimRequest(i, 0.5 * i, "image", 1, 196, 10, 20) for i in range(3)]
    base = dict(hop_s=0.0014, prefill_step_s=0.002, decode_step_s=0.0005)
    before, after = (run("E@cpu, P@cpu, D@cpu", profile(**base, **kv), requests)[1] for kv in ({}, {"kv_hop_s": 0.0064}))
    for b, a in zip(before, after):
        assert a.first_token == pytest.approx(b.first_token, abs=1e-9)
        assert a.finish - b.finish == pytest.approx(0.0064 - 0.0014, abs=1e-9)
    combined = [run("E@cpu, P+D@cpu", profile(**base, **kv), requests)[1] for kv in ({}, {"kv_hop_s": 0.0064})]
    assert [(r.first_token, r.finish) for r in combined[0]] == [(r.first_token, r.finish) for r in combined[1]]


def test_profiles_pool_the_kv_hop_only_when_every_one_measured_it():
    a, b, c = (profile(hop_s=0.001, kv_hop_s=0.003), profile(hop_s=0.002, kv_hop_s=0.005), profile(hop_s=0.001))
    assert pool_profiles([a, b]).overheads.kv_hop_s == pytest.approx(0.004)
    assert pool_profiles([a, c]).overheads.kv_hop_s is None
    assert with_kv_hop(c, 0.0045).overheads.kv_hop_s == 0.0045 and c.overheads.kv_hop_s is None
    with pytest.raises(ValueError, match="no overheads"):
        with_kv_hop(c.model_copy(update={"overheads": None}), 0.004)
    with pytest.raises(ValueError):
        ProfileOverheads(kv_hop_s=-0.001)


def test_a_cluster_without_a_decode_worker_is_refused_with_what_to_start():
    with pytest.raises(LiveClusterError, match="--llm prefill,decode"):
        check_pair([{"role": "encode"}, {"role": "combined"}], "http://x")
    check_pair([{"role": "encode"}, {"role": "prefill"}, {"role": "decode"}], "http://x")


@pytest.mark.slow
def test_the_hand_off_is_timed_on_a_real_prefill_decode_pair(redis_url, tmp_path):
    spec = ClusterSpec(encode_workers=1, llm_roles=["prefill", "decode"], redis_url=redis_url,
                       key_prefix=f"tstest-{uuid.uuid4().hex[:10]}", port=free_port())
    with LocalCluster(spec, tmp_path) as cluster:
        median, samples = asyncio.run(measure_kv_hop(cluster.url, requests=8))
    assert len(samples) == 8 and all(0.0 < s < 1.0 for s in samples)
    assert min(samples) <= median <= max(samples)


@pytest.mark.slow
def test_a_combined_cluster_has_no_hand_off_to_time(live_cluster):
    with pytest.raises(LiveClusterError, match="needs a decode worker"):
        asyncio.run(measure_kv_hop(live_cluster.url, requests=2))
