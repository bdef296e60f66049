"""Nodes whose workers time-slice one CPU core (Simulator(shared_cores=...), sim_gpu.SharedCore)."""

from __future__ import annotations

import pytest

from coordinator.planner.deployment import Deployment
from coordinator.planner.goodput import NodeUsage
from coordinator.planner.sim import Simulator
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import SharedCore, SharedGPU
from coordinator.planner.workload import SimRequest
from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig
from tests.planner.test_sim import Table, workload

EPD = "E@cpu, P@cpu, D@cpu"
"""Node names 0-E-cpu, 1-P-cpu, 2-D-cpu."""


def request(rid: int, arrival: float, out: int = 3) -> SimRequest:
    return SimRequest(rid, arrival, "image", 1, 16, 16, out)


def simulate(requests, shared_cores=(), spec: str = EPD, table: Table | None = None, coast: bool = True):
    sim = Simulator(Deployment.parse(spec), table or Table(), kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                    shared_cores=shared_cores, coast=coast)
    return sim.run(requests)


def test_busy_lanes_split_the_core_equally_and_speed_up_as_others_finish():
    events, done = EventQueue(), {}
    core = SharedCore(events, "core 0")
    lanes = [core.lane(f"n{i}") for i in range(3)]
    for lane, work in zip(lanes, (0.3, 0.6, 0.9)):
        lane.run(work, lambda name: done.__setitem__(name, events.now), work)
    events.run()
    # all three at 1/3 until the first is through (0.9 s), then two at 1/2 (0.3 s left each of... 0.6 s), then one
    assert done == pytest.approx({0.3: 0.9, 0.6: 1.5, 0.9: 1.8})
    assert not any(lane.busy for lane in lanes)


def test_a_lane_alone_runs_at_full_speed():
    events, done = EventQueue(), {}
    lane = SharedCore(events, "core 0").lane("n0")
    lane.run(0.25, lambda _: done.__setitem__("t", events.now), None)
    with pytest.raises(RuntimeError, match="already busy"):
        lane.run(0.1, lambda _: None, None)
    events.run()
    assert done["t"] == pytest.approx(0.25)


def test_an_encoder_and_a_prefill_worker_on_one_core_slow_each_other_only_while_both_compute():
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    reqs = [request(0, 0.0), request(1, 0.015)]
    alone = {r.request.request_id: r for r in simulate(reqs, table=table).records}
    shared = {r.request.request_id: r for r in simulate(reqs, [{"0-E-cpu", "1-P-cpu"}], table=table).records}
    # alone: encode 0-0.010, transfer, prefill 0.011-0.031; request 1 encodes 0.015-0.025
    assert alone[0].first_token == pytest.approx(0.031) and alone[1].encode_end == pytest.approx(0.025)
    # shared: the prefill runs alone 0.011-0.015 (0.004 done), then both at half speed until the encode's
    # 0.010 s of work is through at 0.035 (prefill: 0.010 more done), then the last 0.006 alone
    assert shared[1].encode_end == pytest.approx(0.035)
    assert shared[0].first_token == pytest.approx(0.041)
    assert shared[0].encode_end == pytest.approx(alone[0].encode_end)  # nothing else ran then
    # the decode node keeps a core of its own: its steps still take 0.005 s each
    assert shared[0].finish - shared[0].first_token == pytest.approx(alone[0].finish - alone[0].first_token)


def test_a_shared_core_changes_nothing_when_its_workers_never_overlap():
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    reqs = [request(i, 0.5 * i, out=4) for i in range(20)]  # each done in ~50 ms
    alone = simulate(reqs, table=table).records
    shared = simulate(reqs, [{"0-E-cpu", "1-P-cpu", "2-D-cpu"}], table=table).records
    gaps = [b.request.arrival - a.finish for a, b in zip(alone, alone[1:])]
    assert min(gaps) > 0  # the premise: no two requests in the cluster at once
    for a, s in zip(alone, shared):
        assert (s.first_token, s.finish) == pytest.approx((a.first_token, a.finish))


def test_two_decoders_on_one_core_each_step_at_half_speed():
    """A combined and a decode worker time-slicing a core (the E+P layout's remote side): while both
    decode, every step of each takes twice as long."""
    table = Table(encode=0.001, transfer=0.0, prefill=0.002, decode=0.010)
    spec = "E+P@cpu, P+D@cpu, D@cpu"
    reqs = [request(0, 0.0, out=41), request(1, 0.0, out=41)]
    knobs = {"offload": {"s": 0.5}, "partition": {"mode": "none"}}
    sim = Simulator(Deployment.parse(spec, **knobs), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                    shared_cores=[{"1-P+D-cpu", "2-D-cpu"}])
    records = sim.run(reqs).records
    assert {r.decode_node for r in records} == {"1-P+D-cpu", "2-D-cpu"}  # one each: s = 0.5
    for r in records:
        assert r.tpot == pytest.approx(0.020, rel=0.1)
    alone = Simulator(Deployment.parse(spec, **knobs), table, kv_bytes_per_token=1000,
                      embedding_bytes_per_token=100).run(reqs).records
    for r in alone:
        assert r.tpot == pytest.approx(0.010, rel=0.1)


def test_shared_core_groups_are_checked():
    with pytest.raises(ValueError, match="lacks"):
        simulate([request(0, 0.0)], [{"0-E-cpu", "9-P-cpu"}])
    with pytest.raises(ValueError, match="more than one shared core"):
        simulate([request(0, 0.0)], [{"0-E-cpu", "1-P-cpu"}, {"1-P-cpu", "2-D-cpu"}])
    with pytest.raises(ValueError, match="E\\+P node"):
        simulate([request(0, 0.0)], [{"0-E+P-cpu", "1-P+D-cpu"}], spec="E+P@cpu, P+D@cpu, D@cpu")


def test_stolen_steps_on_a_shared_core_do_not_coast_and_still_finish():
    """Work stealing on an E node whose core another worker shares: stolen steps run through the core."""
    table = Table(encode=0.002, transfer=0.001, prefill=0.004, decode=0.003)
    reqs = workload(40.0, output_tokens=20).generate(60, seed=1)
    knobs = {"stealing": {"enabled": True, "remote_load_threshold": 0}}
    sim = Simulator(Deployment.parse("E@cpu, P+D@cpu", **knobs), table, kv_bytes_per_token=1000,
                    embedding_bytes_per_token=100, shared_cores=[{"0-E-cpu", "1-P+D-cpu"}])
    result = sim.run(reqs)
    assert result.encoders[0].stolen > 0
    assert all(r.finish >= r.first_token > r.request.arrival for r in result.records)


def test_the_e_plus_p_gpu_still_splits_as_before():
    events, usage, done = EventQueue(), NodeUsage("ep", "l4", "E+P"), {}
    g = SharedGPU(events, SMPartition(64, SMPartitionConfig(mode="none")), usage)
    g.start_prefill(1.0, lambda n: done.__setitem__(n, events.now), "prefill")
    g.start_encode(0.5, 1, 100, 1000, lambda n: done.__setitem__(n, events.now), "encode")
    events.run()
    assert done == pytest.approx({"encode": 1.0, "prefill": 1.5})
    assert usage.busy_s == pytest.approx(1.5)


# --- loads as heartbeats report them (Simulator(load_report_s=...)) --------------------------------

def steal_run(load_report_s: float):
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    knobs = {"stealing": {"enabled": True, "remote_load_threshold": 1}}
    sim = Simulator(Deployment.parse("E@cpu, P+D@cpu", **knobs), table, kv_bytes_per_token=1000,
                    embedding_bytes_per_token=100, load_report_s=load_report_s)
    return sim.run([request(0, 0.1, out=100), request(1, 0.15, out=3)])


def test_stealing_sees_the_remote_load_as_of_its_last_heartbeat():
    exact = steal_run(0.0).records
    assert not exact[0].stolen and exact[1].stolen  # request 0 is on the remote worker when 1 is encoded
    stale = steal_run(0.5).records
    # the remote worker last reported at 0.1 s, before request 0 reached it: load 0, below the threshold
    assert not stale[0].stolen and not stale[1].stolen
    assert all(r.finish > r.first_token for r in stale)


def test_load_reports_stop_with_the_run():
    result = steal_run(0.05)
    assert result.events < 400  # the heartbeat does not keep an empty run alive
    with pytest.raises(ValueError, match="load_report_s"):
        Simulator(Deployment.parse(EPD), Table(), kv_bytes_per_token=1, embedding_bytes_per_token=1, load_report_s=-1)


def test_time_slicing_loses_what_core_sharing_says_only_while_two_lanes_are_busy():
    """sharing 0.8: two busy lanes each run at 0.4, a lane alone at 1 (its caches are its own again)."""
    events, done = EventQueue(), {}
    core = SharedCore(events, "core 0", sharing=0.8)
    a, b = core.lane("a"), core.lane("b")
    a.run(0.4, lambda name: done.__setitem__(name, events.now), "a")
    b.run(1.0, lambda name: done.__setitem__(name, events.now), "b")
    events.run()
    # both at 0.4 until a's 0.4 s of work is through at 1.0 s (b: 0.4 done), then b alone: 0.6 s more
    assert done == pytest.approx({"a": 1.0, "b": 1.6})
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="sharing must be in"):
            SharedCore(EventQueue(), "core 1", sharing=bad)


def test_a_lane_that_runs_first_alone_keeps_the_whole_core_whatever_the_sharing():
    events, done = EventQueue(), {}
    core = SharedCore(events, "core 0", sharing=0.5)
    first, other = core.lane("stack", first=True), core.lane("worker")
    other.run(1.0, lambda _: done.__setitem__("worker", events.now), None)
    first.run(0.2, lambda _: done.__setitem__("stack", events.now), None)
    events.run()
    assert done == pytest.approx({"stack": 0.2, "worker": 1.2})


def test_core_sharing_slows_only_overlapping_work_and_is_checked():
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)

    def run(reqs, sharing):
        sim = Simulator(Deployment.parse(EPD), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                        shared_cores=[{"0-E-cpu", "1-P-cpu"}], core_sharing=sharing)
        return {r.request.request_id: r for r in sim.run(reqs).records}

    overlap = [request(0, 0.0), request(1, 0.015)]
    full, lossy = run(overlap, 1.0), run(overlap, 0.5)
    # sharing 0.5: from 0.015 both run at 0.25; the encode's 0.010 s takes until 0.055 (prefill: 0.004 + 0.010
    # done by then), the prefill's last 0.006 s alone
    assert full[1].encode_end == pytest.approx(0.035) and lossy[1].encode_end == pytest.approx(0.055)
    assert lossy[0].first_token == pytest.approx(0.061)
    apart = [request(i, 0.5 * i, out=4) for i in range(5)]
    assert [t for r in run(apart, 0.5).values() for t in (r.first_token, r.finish)] == pytest.approx(
        [t for r in run(apart, 1.0).values() for t in (r.first_token, r.finish)])
    with pytest.raises(ValueError, match="core_sharing must be in"):
        Simulator(Deployment.parse(EPD), table, kv_bytes_per_token=1, embedding_bytes_per_token=1, core_sharing=0.0)


def test_a_group_takes_its_own_share_and_the_rest_the_common_one():
    """group_sharing[i] for shared_cores[i]: the E/P core at 0.5 as above while the common core_sharing is 1.0, and
    the reverse; a group without its own share takes core_sharing."""
    table = Table(encode=0.010, transfer=0.001, prefill=0.020, decode=0.005)
    overlap = [request(0, 0.0), request(1, 0.015)]

    def encode_end(**kw) -> float:
        sim = Simulator(Deployment.parse(EPD), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                        shared_cores=[{"0-E-cpu", "1-P-cpu"}], **kw)
        return sim.run(overlap).records[1].encode_end

    assert encode_end(core_sharing=1.0, group_sharing=[0.5]) == pytest.approx(0.055)
    assert encode_end(core_sharing=0.5, group_sharing=[1.0]) == pytest.approx(0.035)
    assert encode_end(core_sharing=0.5, group_sharing=[]) == pytest.approx(0.055)
    for bad in ([0.0], [0.5, 0.5]):                                  # out of range; more shares than groups
        with pytest.raises(ValueError, match="group_sharing gives one share"):
            encode_end(group_sharing=bad)


def test_an_unpartitioned_e_plus_p_processor_loses_the_same_share():
    events = EventQueue()
    usage = NodeUsage("0-E+P-cpu", "cpu", "E+P")
    gpu = SharedGPU(events, SMPartition(64, SMPartitionConfig(mode="none")), usage, sharing=0.8)
    done = {}
    gpu.start_encode(0.4, 1, 16, 0, lambda _: done.__setitem__("encode", events.now), None)
    gpu.start_prefill(0.4, lambda _: done.__setitem__("prefill", events.now), None)
    events.run()
    assert done == pytest.approx({"encode": 1.0, "prefill": 1.0})


def test_a_lane_counts_what_the_stack_lanes_beside_it_added_and_not_what_other_workers_did():
    """A worker's job of 0.6 s beside a stack job of 0.2 s and another worker's job of 0.3 s, from t = 0, perfect
    sharing: three at 1/3 until the stack job is through (0.6 s), two at 1/2 until the other worker's is (0.8 s),
    then alone (0.3 s left: 1.1 s). Over 0-0.6 s the worker lost 0.4 s, half of it to the stack lane (one of the two
    others); over 0.6-0.8 s 0.1 s, none of it. By the stack: 0.2 s of the 0.5 s added."""
    events, done = EventQueue(), {}
    core = SharedCore(events, "core 0")
    worker, other, stack = core.lane("n0"), core.lane("n1"), core.lane("stack", stack=True)
    for lane, work in ((worker, 0.6), (other, 0.3), (stack, 0.2)):
        lane.run(work, lambda w: done.__setitem__(w, events.now), work)
    events.run()
    assert done == pytest.approx({0.2: 0.6, 0.3: 0.8, 0.6: 1.1})
    assert worker.held_by_stack == pytest.approx(0.2)
    assert other.held_by_stack == pytest.approx(0.2)     # 0.4 s lost over 0-0.6 s, half to the stack
    assert stack.held_by_stack == pytest.approx(0.0)     # it is the stack: what other stack lanes add would count
    worker.run(0.1, lambda _: None, None)                # a new job starts its count afresh
    events.run()
    assert worker.held_by_stack == 0.0


def test_a_stack_lane_that_runs_first_holds_a_worker_back_whole():
    """With the stack preempting (Simulator.stack_preempts), a worker waits while a stack job runs: all of its wait
    is the stack's."""
    events, done = EventQueue(), {}
    core = SharedCore(events, "core 0")
    worker, stack = core.lane("n0"), core.lane("stack", first=True, stack=True)
    worker.run(0.5, lambda _: done.__setitem__("worker", events.now), None)
    events.at(0.1, lambda _: stack.run(0.2, lambda _: done.__setitem__("stack", events.now), None), None)
    events.run()
    assert done == pytest.approx({"stack": 0.3, "worker": 0.7})
    assert worker.held_by_stack == pytest.approx(0.2)


def test_a_worker_waiting_behind_a_preempting_stack_lane_is_held_by_the_stack_alone():
    """A first-running stack job beside two workers: both wait for it whole (the other worker takes nothing from them
    meanwhile), then share the core: only the stack's 0.1 s counts as the stack's."""
    events = EventQueue()
    core = SharedCore(events, "core 0")
    a, b, stack = core.lane("a"), core.lane("b"), core.lane("stack", first=True, stack=True)
    a.run(0.2, lambda _: None, None)
    b.run(0.2, lambda _: None, None)
    stack.run(0.1, lambda _: None, None)
    events.run()
    assert a.held_by_stack == pytest.approx(0.1) and b.held_by_stack == pytest.approx(0.1)
