"""How the OS runs the serving stack beside pinned workers (sim_fidelity_layouts, 2026-12-02): a woken stack
job goes to its waker's core when no core is freer (wake_affine); the coordinator's own CPU shares its one
event loop with its hops (stack_loop_share); brief wake-ups preempt a worker that computes (stack_preempts)."""

from __future__ import annotations

import pytest

from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import SharedCore
from coordinator.planner.sim_stack import _Fifo
from tests.planner.test_sim_stack import HopTable, request
from tests.planner.test_sim_stack_float import RelayTable, run


def busy_cores():
    """Two cores, each with a worker busy for 1 s, and a floating stack queue over both (shares 0.9 / 0.1)."""
    events = EventQueue()
    a, b = SharedCore(events, "a"), SharedCore(events, "b")
    for core in (a, b):
        core.lane("worker").run(1.0, lambda _: None, None)
    return events, a, b, _Fifo([(a.lane("stack"), 0.9), (b.lane("stack"), 0.1)], idlest=True)


def test_with_no_freer_core_a_woken_job_runs_on_its_wakers_core():
    events, a, b, fifo = busy_cores()
    fifo.submit(0.1, None)  # no waker (a client's request): the larger share
    fifo.submit(0.1, None, None, b)  # woken by b's worker (its tokens): b
    events.run()
    assert fifo.charged == {"a": pytest.approx(0.1), "b": pytest.approx(0.1)}


def test_a_freer_core_still_wins_over_the_wakers_core():
    events = EventQueue()
    a, b = SharedCore(events, "a"), SharedCore(events, "b")
    b.lane("worker").run(1.0, lambda _: None, None)  # a is idle
    fifo = _Fifo([(a.lane("stack"), 0.5), (b.lane("stack"), 0.5)], idlest=True)
    fifo.submit(0.1, None, None, b)
    events.run()
    assert fifo.charged == {"a": pytest.approx(0.1)}


def test_wake_affine_moves_the_relay_to_the_decoding_workers_core():
    # the encoder keeps core 0 busy (50 ms a request) while the P+D worker decodes on core 1: a relay job
    # that waited in the stack's queue starts with both cores busy; without wake_affine it goes to core 0
    # (the larger share), with it to core 1, where its tokens came from
    table = RelayTable(encode=0.05, prefill=0.002, decode=0.005, token_cpu=0.0005)
    reqs = [request(i, 0.05 * i, out=30) for i in range(10)]
    shares = {"0-E-cpu": 0.9, "1-P+D-cpu": 0.1}
    plain = run(reqs, table, stack_cores=shares, stack_placement="idlest").stack_cpu_s
    affine = run(reqs, table, stack_cores=shares, stack_placement="idlest", wake_affine=True).stack_cpu_s
    total = 10 * 30 * 0.0005
    assert sum(plain.values()) == sum(affine.values()) == pytest.approx(total)
    assert plain["0-E-cpu"] > 0.25 * total
    assert affine.get("0-E-cpu", 0.0) == pytest.approx(0.0)


def test_the_coordinators_relay_cpu_delays_its_hops_in_its_one_loop():
    # four requests decode together; 3 ms of relay CPU a token, all of it the coordinator's (loop share 1):
    # the last token's way out waits behind relaying in the coordinator's loop
    table = RelayTable(encode=0.001, prefill=0.002, decode=0.005, token_cpu=0.003, way_out=0.002)
    reqs = [request(i, 0.0, out=20) for i in range(4)]
    beside = run(reqs, table, stack_placement="idlest")
    in_loop = run(reqs, table, stack_placement="idlest", stack_loop_share=1.0)
    assert max(r.finish for r in in_loop.records) > max(r.finish for r in beside.records) + 0.002
    assert sum(in_loop.stack_cpu_s.values()) == pytest.approx(sum(beside.stack_cpu_s.values()))
    with pytest.raises(ValueError, match="stack_loop_share"):
        run(reqs, table, stack_loop_share=1.5)


def test_a_lane_that_runs_first_preempts_the_worker_and_the_worker_pays_for_it():
    events = EventQueue()
    core = SharedCore(events, "c")
    worker, stack = core.lane("worker"), core.lane("stack", first=True)
    done = {}
    worker.run(1.0, lambda _: done.setdefault("worker", events.now), None)
    stack.run(0.1, lambda _: done.setdefault("stack", events.now), None)
    events.run()
    assert done == {"stack": pytest.approx(0.1), "worker": pytest.approx(1.1)}


def test_a_preempting_hop_is_not_stretched_by_the_workers_next_step():
    # as in test_a_floating_hop_leaves_the_core_whose_worker_starts_its_next_step, placed "idlest" on the
    # worker's core: time-sliced it takes twice the way out; run first it takes the way out
    table = HopTable(encode=0.002, prefill=0.010, decode=0.005, way_in=0.001, way_out=0.004)
    reqs = [request(0, 0.0, out=20)]
    shared = run(reqs, table, stack_placement="idlest").records[0]
    first = run(reqs, table, stack_placement="idlest", stack_preempts=True).records[0]
    assert shared.to_client == pytest.approx(0.008)
    assert first.to_client == pytest.approx(0.004)
    assert first.finish > shared.finish - 0.004  # the worker's steps wait instead: the tokens come no sooner
