"""Mechanisms of the live one-host cluster the simulator can follow (sim_fidelity_layouts, 2026-12-03): the
stack floating to a freer core, the token relay paid per published step, an offload router that routed before."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coordinator.planner.deployment import Deployment
from coordinator.planner.sim import Simulator
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import SharedCore
from coordinator.policies.offload import OffloadRouter
from tests.planner.test_sim_stack import HopTable, request

CORES = {"0-E-cpu": 0.1, "1-P+D-cpu": 0.9}
"""Ties go to the LLM worker's core (its larger share), as in the live stealing and adaptive layouts."""


def run(reqs, table, spec="E@cpu, P+D@cpu", stack_cores=CORES, **kw):
    sim = Simulator(Deployment.parse(spec), table, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                    stack_cores=stack_cores, **kw)
    return sim.run(reqs)


def test_a_floating_hop_leaves_the_core_whose_worker_starts_its_next_step():
    # The first token's way out is placed as the prefill step ends, when the worker's core looks idle; the
    # worker starts its next (decode) step at that same instant. "idlest" keeps the hop there, time-sliced
    # with the worker (twice as long); "float" moves it to the encoder's idle core, as the OS would.
    table = HopTable(encode=0.002, prefill=0.010, decode=0.005, way_in=0.001, way_out=0.004)
    reqs = [request(0, 0.0, out=20)]
    stuck = run(reqs, table, stack_placement="idlest").records[0]
    moved = run(reqs, table, stack_placement="float")
    assert stuck.to_client == pytest.approx(0.008)
    assert moved.records[0].to_client == pytest.approx(0.004)
    assert sum(moved.stack_cpu_s.values()) == pytest.approx(0.001 + 2 * 0.004)  # in, first and last out: moved, not added


def test_a_floating_job_only_moves_to_a_core_with_fewer_busy_lanes():
    events = EventQueue()
    a, b = SharedCore(events, "a"), SharedCore(events, "b")
    worker_a, worker_b = a.lane("wa"), b.lane("wb")
    from coordinator.planner.sim_stack import _Fifo

    fifo = _Fifo([(a.lane("stack"), 0.5), (b.lane("stack"), 0.5)], idlest=True)
    done = []
    worker_a.run(1.0, lambda _: None, None)
    worker_b.run(1.0, lambda _: None, None)
    fifo.submit(0.1, lambda _: done.append(events.now))
    fifo.migrate()  # both cores have one busy worker: it stays, at half speed
    events.run()
    assert done == [pytest.approx(0.2)]
    assert sum(fifo.charged.values()) == pytest.approx(0.1)


def _two_cores():
    events = EventQueue()
    a, b = SharedCore(events, "a"), SharedCore(events, "b")
    return events, a, b


def test_by_load_a_stack_job_queues_beside_another_stack_job_rather_than_beside_a_computing_worker():
    # Core a runs the coordinator's loop (a stack lane), core b a worker's step; both have one busy lane. "float"
    # breaks the tie by share (b's larger) and time-slices the relay with the worker; "load" counts the worker
    # first and puts the relay beside the loop, where the worker's step is left alone (benchmarks/worker_cpu.py).
    from coordinator.planner.sim_stack import _Fifo

    for by_load, core, worker_done in ((False, "b", 1.1), (True, "a", 1.0)):
        events, a, b = _two_cores()
        loop, worker = a.lane("stack hops"), b.lane("1-P+D-cpu")
        fifo = _Fifo([(a.lane("stack"), 0.2), (b.lane("stack"), 0.8)], idlest=True, by_load=by_load)
        ends = []
        loop.run(1.0, lambda _: None, None)
        worker.run(1.0, lambda _: ends.append(events.now), None)
        fifo.submit(0.1, lambda _: None)
        events.run()
        assert list(fifo.charged) == [f"{core}"], by_load
        assert ends == [pytest.approx(worker_done)]


def test_by_load_a_stack_job_leaves_a_core_whose_worker_starts_for_one_with_only_stack_jobs():
    from coordinator.planner.sim_stack import _Fifo

    for by_load, moved in ((False, False), (True, True)):
        events, a, b = _two_cores()
        loop, worker = a.lane("stack hops"), b.lane("2-D-cpu")
        fifo = _Fifo([(a.lane("stack"), 0.5), (b.lane("stack"), 0.5)], idlest=True, by_load=by_load)
        loop.run(1.0, lambda _: None, None)
        fifo.submit(0.4, lambda _: None)           # b is idle: the job starts there
        assert fifo.running is not None and fifo.running.core is b
        worker.run(1.0, lambda _: None, None)      # the worker wakes on its core
        fifo.migrate()
        assert (fifo.running.core is a) == moved, by_load
        events.run()
        assert sum(fifo.charged.values()) == pytest.approx(0.4)


@dataclass(frozen=True)
class RelayTable(HopTable):
    token_cpu: float = 0.0

    def stack_cpu_s(self, output_tokens):
        return self.cpu + self.token_cpu * output_tokens


def test_the_relay_cpu_per_step_is_paid_once_for_a_whole_batch():
    # four requests decode together: per token the relay costs 4 x the steps, per step once per step
    table = RelayTable(encode=0.001, prefill=0.002, decode=0.005, token_cpu=0.001)
    reqs = [request(i, 0.0, out=50) for i in range(4)]
    per_token = sum(run(reqs, table, stack_placement="idlest").stack_cpu_s.values())
    per_step = sum(run(reqs, table, stack_placement="idlest", relay_per_step=True).stack_cpu_s.values())
    assert per_token == pytest.approx(0.001 * 200, rel=0.01)
    assert per_step < 0.45 * per_token  # ~50-60 steps for 200 tokens
    # one request alone decodes one token a step: both readings agree
    alone = [request(0, 0.0, out=50)]
    assert sum(run(alone, table, stack_placement="idlest", relay_per_step=True).stack_cpu_s.values()) == \
        pytest.approx(sum(run(alone, table, stack_placement="idlest").stack_cpu_s.values()))


def test_a_router_that_routed_before_continues_its_line():
    spec = "E+P@cpu, P+D@cpu, D@cpu"
    knobs = {"offload": {"s": 0.5}, "partition": {"mode": "none"}}
    dep = Deployment.parse(spec, **knobs)
    reqs = [request(i, i * 0.5) for i in range(4)]

    def local(before):
        sim = Simulator(dep, HopTable(), kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                        offload_routed_before=before)
        return [r.local for r in sim.run(reqs).records]

    assert local(0) == [True, False, True, False]
    assert local(1) == [False, True, False, True]  # the replayer's one image probe went local before
    assert local(2) == local(0)
    router = OffloadRouter(0.3)
    router.continue_after(7)
    fresh = OffloadRouter(0.3)
    for _ in range(7):
        fresh.route(True, True)
    assert [router.route(True, True) for _ in range(10)] == [fresh.route(True, True) for _ in range(10)]
    with pytest.raises(ValueError, match="offload_routed_before"):
        Simulator(dep, HopTable(), kv_bytes_per_token=1, embedding_bytes_per_token=1, offload_routed_before=-1)
