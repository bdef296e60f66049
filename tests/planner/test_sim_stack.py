"""The coordinator's hops in the simulator (sim_stack.py): as delays, and on a core shared with a worker."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import PrefillPoint, Profile, ProfileOverheads
from coordinator.planner.sim import Simulator
from coordinator.planner.ttft_stages import sim_stages
from coordinator.planner.workload import SimRequest
from tests.planner.test_sim import Table

COMBINED = "E@cpu, P+D@cpu"
"""Node names 0-E-cpu, 1-P+D-cpu."""


@dataclass(frozen=True)
class HopTable(Table):
    """Table plus the stack's hops (way in, way out) and its CPU per request."""

    way_in: float = 0.0
    way_out: float = 0.0
    cpu: float = 0.0

    def request_hops_s(self):
        return self.way_in, self.way_out

    def stack_cpu_s(self, output_tokens):
        return self.cpu


def request(rid: int, arrival: float, out: int = 3) -> SimRequest:
    return SimRequest(rid, arrival, "image", 1, 16, 16, out)


def simulate(requests, table, stack_core=None, shared_cores=(), spec=COMBINED):
    sim = Simulator(Deployment.parse(spec), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                    shared_cores=shared_cores, stack_core=stack_core)
    return sim.run(requests)


def test_hops_as_delays_add_to_ttft_and_land_in_their_own_stages():
    reqs = [request(0, 0.0)]
    bare = simulate(reqs, HopTable()).records[0]
    hops = simulate(reqs, HopTable(way_in=0.004, way_out=0.007)).records[0]
    assert hops.ttft == pytest.approx(bare.ttft + 0.011)
    assert hops.tpot == pytest.approx(bare.tpot)  # the last token takes the same way out
    assert hops.encode_start == pytest.approx(0.004) and hops.to_client == pytest.approx(0.007)
    stages = sim_stages([hops])
    assert stages["to_encode"] == pytest.approx(0.004) and stages["to_client"] == pytest.approx(0.007)
    assert stages["to_first_token"] == pytest.approx(bare.first_token - bare.encode_end)


def test_hops_on_an_idle_core_take_their_idle_latency():
    reqs = [request(0, 0.0)]
    delays = simulate(reqs, HopTable(way_in=0.004, way_out=0.007)).records[0]
    on_core = simulate(reqs, HopTable(way_in=0.004, way_out=0.007), stack_core="0-E-cpu").records[0]
    assert on_core.ttft == pytest.approx(delays.ttft)


def test_the_stacks_cpu_on_a_shared_core_slows_the_worker_and_its_hops_grow_with_load():
    table = HopTable(encode=0.010, way_in=0.004, way_out=0.004, cpu=0.030)
    reqs = [request(i, i * 0.02, out=4) for i in range(40)]  # 50 req/s: the encoder alone is half busy
    delays = simulate(reqs, table).records
    on_core = simulate(reqs, table, stack_core="0-E-cpu").records
    mean = lambda xs: sum(xs) / len(xs)
    # the encoder shares its core with the stack's hops and the rest of its CPU: its forwards take longer
    assert mean([r.encode_end - r.encode_start for r in on_core]) > 1.2 * mean(
        [r.encode_end - r.encode_start for r in delays])
    # and the hops wait for the core: the way in and the way out exceed their idle 4 ms on average
    assert mean([r.to_client for r in on_core]) > 0.0045
    assert mean([r.encode_start - r.request.arrival for r in on_core]) > 0.0045
    assert mean([r.ttft for r in on_core]) > mean([r.ttft for r in delays])


def test_the_stack_joins_a_core_already_shared_by_workers():
    table = HopTable(encode=0.010, way_in=0.002, way_out=0.002, cpu=0.020)
    reqs = [request(i, i * 0.02) for i in range(20)]
    spec = "E@cpu, P@cpu, D@cpu"
    alone = simulate(reqs, table, shared_cores=[{"0-E-cpu", "1-P-cpu"}], spec=spec).records
    stacked = simulate(reqs, table, stack_core="1-P-cpu", shared_cores=[{"0-E-cpu", "1-P-cpu"}], spec=spec).records
    assert sum(r.ttft for r in stacked) > sum(r.ttft for r in alone)


def test_a_stack_core_must_be_a_node_and_not_an_e_plus_p_one():
    with pytest.raises(ValueError, match="not a node"):
        simulate([request(0, 0.0)], HopTable(), stack_core="9-E-cpu")
    with pytest.raises(ValueError, match="E\\+P node"):
        simulate([request(0, 0.0)], HopTable(), stack_core="0-E+P-cpu", spec="E+P@cpu, D@cpu")


def test_a_service_with_only_a_request_latency_has_it_all_on_the_way_out():
    class Latency(Table):
        def request_latency_s(self):
            return 0.009

    r = simulate([request(0, 0.0)], Latency()).records[0]
    assert r.to_client == pytest.approx(0.009) and r.encode_start == pytest.approx(0.0)


def _profile(**overheads) -> Profile:
    return Profile(tier="cpu", model="tiny-llava", measured_at="2026-12-02",
                   prefill=(PrefillPoint(tokens=16, seconds=0.01),), overheads=ProfileOverheads(**overheads))


def test_perf_model_splits_the_request_latency_by_the_measured_way_in_else_by_the_given_share():
    arch, catalog = get_arch("tiny-llava"), load_catalog()
    measured = PerfModel(catalog, arch, [_profile(request_latency_s=0.02, request_in_s=0.008)], hop_in_share=0.9)
    assert measured.request_hops_s() == pytest.approx((0.008, 0.012))
    shared = PerfModel(catalog, arch, [_profile(request_latency_s=0.02)], hop_in_share=0.25)
    assert shared.request_hops_s() == pytest.approx((0.005, 0.015))
    assert PerfModel(catalog, arch, [_profile(request_latency_s=0.02)]).request_hops_s() == pytest.approx((0.0, 0.02))
    cpu = PerfModel(catalog, arch, [_profile(stack_cpu_request_s=0.01, stack_cpu_token_s=0.001)])
    assert cpu.stack_cpu_s(10) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="hop_in_share"):
        PerfModel(catalog, arch, [], hop_in_share=1.5)
