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


def simulate(requests, table, stack_core=None, shared_cores=(), spec=COMBINED, stack_cores=None,
             placement="share", **knobs):
    cores = stack_cores if stack_cores is not None else ({stack_core: 1.0} if stack_core else None)
    sim = Simulator(Deployment.parse(spec, **knobs), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                    shared_cores=shared_cores, stack_cores=cores, stack_placement=placement)
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


def test_stack_cores_must_be_nodes_with_positive_shares_and_an_e_plus_p_one_unpartitioned():
    with pytest.raises(ValueError, match="lacks"):
        simulate([request(0, 0.0)], HopTable(), stack_core="9-E-cpu")
    with pytest.raises(ValueError, match="positive sum"):
        simulate([request(0, 0.0)], HopTable(), stack_cores={"0-E-cpu": -1.0, "1-P+D-cpu": 0.5})
    with pytest.raises(ValueError, match="mode='none'"):
        simulate([request(0, 0.0)], HopTable(), stack_core="0-E+P-cpu", spec="E+P@cpu, D@cpu",
                 partition={"mode": "static"})
    with pytest.raises(ValueError, match="stack_placement"):
        simulate([request(0, 0.0)], HopTable(), stack_core="0-E-cpu", placement="random")


def test_the_stacks_cpu_is_split_over_its_cores_by_their_shares():
    table = HopTable(encode=0.010, way_in=0.004, way_out=0.004, cpu=0.030)
    reqs = [request(i, i * 0.05) for i in range(10)]
    split = simulate(reqs, table, stack_cores={"0-E-cpu": 3.0, "1-P+D-cpu": 1.0})
    total = sum(split.stack_cpu_s.values())
    assert total == pytest.approx(10 * 0.030)  # hops + the rest: the profile's CPU per request, all of it
    assert split.stack_cpu_s["0-E-cpu"] == pytest.approx(0.75 * total)
    # a hop split over two idle cores still takes its idle latency
    one = simulate([request(0, 0.0)], table, stack_cores={"0-E-cpu": 1.0, "1-P+D-cpu": 1.0}).records[0]
    assert one.encode_start == pytest.approx(0.004)
    # nodes on one core pool their shares
    spec, shared = "E@cpu, P@cpu, D@cpu", [{"0-E-cpu", "1-P-cpu"}]
    pooled = simulate(reqs, table, spec=spec, shared_cores=shared,
                      stack_cores={"0-E-cpu": 1.0, "1-P-cpu": 1.0, "2-D-cpu": 2.0}).stack_cpu_s
    assert set(pooled) == {"0-E-cpu", "2-D-cpu"} and pooled["0-E-cpu"] == pytest.approx(pooled["2-D-cpu"])


def test_an_e_plus_p_core_takes_the_stack_and_its_workers_slow_down():
    table = HopTable(encode=0.010, way_in=0.002, way_out=0.002, cpu=0.040)
    reqs = [request(i, i * 0.03) for i in range(30)]
    spec, knobs = "E+P@cpu, D@cpu", {"partition": {"mode": "none"}, "offload": {"s": 1.0}}
    delays = simulate(reqs, table, spec=spec, **knobs).records
    on_core = simulate(reqs, table, spec=spec, stack_core="0-E+P-cpu", **knobs)
    mean = lambda xs: sum(xs) / len(xs)
    assert mean([r.encode_end - r.encode_start for r in on_core.records]) > 1.1 * mean(
        [r.encode_end - r.encode_start for r in delays])
    assert set(on_core.stack_cpu_s) == {"0-E+P-cpu"}
    assert on_core.usage[0].stage_busy_s.get("stack", 0.0) == 0.0  # the stack's time is not the node's


def test_the_token_relay_cpu_is_charged_while_the_tokens_are_produced():
    @dataclass(frozen=True)
    class TokenTable(HopTable):
        token_cpu: float = 0.0

        def stack_cpu_s(self, output_tokens):
            return self.cpu + self.token_cpu * output_tokens

    reqs = [request(0, 0.0, out=200), request(1, 0.1)]  # request 1 is encoded while request 0 decodes
    cores = {"0-E-cpu": 1.0, "1-P+D-cpu": 1.0}
    quiet = simulate(reqs, TokenTable(encode=0.010), stack_cores=cores).records[1]
    relayed = simulate(reqs, TokenTable(encode=0.010, token_cpu=0.004), stack_cores=cores)
    busy = relayed.records[1]
    # request 0's tokens are relayed as they come, on request 1's encoder core too (not after its finish)
    assert busy.encode_end - busy.encode_start > 1.1 * (quiet.encode_end - quiet.encode_start)
    assert sum(relayed.stack_cpu_s.values()) == pytest.approx(0.004 * 203, rel=0.02)


def test_idlest_placement_runs_each_stack_job_on_the_core_with_fewer_busy_workers():
    table = HopTable(encode=0.002, way_in=0.002, way_out=0.002, cpu=0.010)
    reqs = [request(i, i * 0.01, out=40) for i in range(40)]  # the P+D core decodes all the time
    cores = {"0-E-cpu": 0.1, "1-P+D-cpu": 0.9}
    shared = simulate(reqs, table, stack_cores=cores).stack_cpu_s
    idlest = simulate(reqs, table, stack_cores=cores, placement="idlest").stack_cpu_s
    assert shared["0-E-cpu"] == pytest.approx(0.1 * sum(shared.values()))
    assert idlest["0-E-cpu"] > 0.5 * sum(idlest.values())
    # on an idle cluster the shares break the tie (the hops alone: one job at a time)
    hops = HopTable(way_in=0.002, way_out=0.002)
    alone = simulate([request(0, 0.0, out=1)], hops, stack_cores=cores, placement="idlest").stack_cpu_s
    assert set(alone) == {"1-P+D-cpu"}


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
