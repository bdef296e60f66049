"""The simulator's parts on their own: the engine model against a naive one, the shared E+P GPU, the clock."""

from __future__ import annotations

import random

import pytest

from coordinator.planner.goodput import NodeUsage, RequestRecord
from coordinator.planner.sim_engine import EngineModel, Flight
from coordinator.planner.sim_events import EventQueue
from coordinator.planner.sim_gpu import SharedGPU
from coordinator.planner.workload import SimRequest
from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig


def flight(rid: int, prompt: int, out: int, produced: int = 0) -> Flight:
    req = SimRequest(rid, 0.0, "image", 1, prompt, 0, out)
    return Flight(RequestRecord(req), prompt, produced)


class NaiveEngine:
    """llm_node/scheduler.py written the obvious way: every sequence carries its own counters."""

    def __init__(self, role: str, max_num_seqs: int, max_tokens: int) -> None:
        self.role, self.max_num_seqs, self.max_tokens = role, max_num_seqs, max_tokens
        self.waiting: list[list[int]] = []   # [id, prompt, out, produced]
        self.running: list[list[int]] = []

    def step(self):
        decodes = list(self.running)
        budget = self.max_tokens - len(decodes)
        prefills = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cost = 1 if self.role == "decode" else seq[1]
            if cost > budget:
                break
            budget -= cost
            self.running.append(self.waiting.pop(0))
            (decodes if self.role == "decode" else prefills).append(seq)
        context = sum(s[1] + s[3] for s in decodes)
        finished, handoffs = [], []
        for s in decodes + prefills:
            s[3] += 1
            if s[3] == s[2]:
                finished.append(s[0])
                self.running.remove(s)
            elif s in prefills and self.role == "prefill":
                handoffs.append(s[0])
                self.running.remove(s)
        return [s[0] for s in prefills], len(decodes), context, sorted(finished), sorted(handoffs)


@pytest.mark.parametrize("role", ["combined", "prefill", "decode"])
@pytest.mark.parametrize("seed", range(3))
def test_engine_model_matches_the_naive_scheduler_step_for_step(role, seed):
    rng = random.Random(seed)
    fast, naive = EngineModel(role, 6, 400), NaiveEngine(role, 6, 400)
    rid, steps_with_work = 0, 0
    for _ in range(2000):
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            prompt, out = rng.randint(1, 200), rng.randint(1, 40)
            produced = 1 if role == "decode" else 0
            out = max(out, 2) if role == "decode" else out
            fast.add(flight(rid, prompt, out, produced))
            naive.waiting.append([rid, prompt, out, produced])
            rid += 1
        if not fast.has_work():
            assert not naive.waiting and not naive.running
            continue
        steps_with_work += 1
        if rng.random() < 0.5 and (step := fast.plain_decode_step()) is not None:
            _, decodes, context, finished, handoffs = naive.step()
            assert (step, finished, handoffs) == ((decodes, context), [], [])
            continue
        plan = fast.schedule()
        result = fast.complete(plan)
        got = ([f.record.request.request_id for f in plan.prefills], plan.decodes, plan.context_tokens,
               sorted(f.record.request.request_id for f in result.finished),
               sorted(f.record.request.request_id for f in result.handoffs))
        assert got == naive.step()
        assert [f.record.request.request_id for f in result.first_tokens] == got[0]
        assert fast.load == len(naive.waiting) + len(naive.running)
        assert fast.waiting_tokens == (0 if role == "decode" else sum(s[1] for s in naive.waiting))
    assert steps_with_work > 500 and rid > 500


def test_engine_model_refuses_what_its_role_cannot_take():
    with pytest.raises(ValueError, match="decode engine needs a prefilled sequence, got produced=0"):
        EngineModel("decode", 4, 100).add(flight(1, 10, 5))
    with pytest.raises(ValueError, match="combined engine prefills.*produced=1"):
        EngineModel("combined", 4, 100).add(flight(1, 10, 5, produced=1))
    with pytest.raises(ValueError, match="prompt of 101 tokens exceeds max_num_batched_tokens=100"):
        EngineModel("prefill", 4, 100).add(flight(1, 101, 5))


def test_rewind_forgets_plain_steps_only_backwards():
    e = EngineModel("combined", 4, 100)
    e.add(flight(0, 10, 5))
    e.complete(e.schedule())
    assert e.plain_decode_step() == (1, 11)
    assert e.plain_decode_step() == (1, 12)
    e.rewind(1)
    assert e.plain_decode_step() == (1, 11)
    with pytest.raises(ValueError, match="cannot rewind forward"):
        e.rewind(9)


# --- the shared E+P GPU -------------------------------------------------------------------------

def gpu(mode: str, **knobs) -> tuple[EventQueue, SharedGPU, NodeUsage, dict]:
    events, usage, done = EventQueue(), NodeUsage("ep", "l4", "E+P"), {}
    shared = SharedGPU(events, SMPartition(64, SMPartitionConfig(mode=mode, **knobs)), usage)
    return events, shared, usage, done


def mark(done: dict, events: EventQueue):
    return lambda name: done.__setitem__(name, events.now)


def test_none_mode_is_processor_sharing():
    events, g, usage, done = gpu("none")
    g.start_prefill(1.0, mark(done, events), "prefill")
    g.start_encode(0.5, 1, 100, 1000, mark(done, events), "encode")
    events.run()
    assert done == pytest.approx({"encode": 1.0, "prefill": 1.5})  # both at half speed, then prefill alone
    assert usage.stage_busy_s["encode"] == pytest.approx(1.0) and usage.busy_s == pytest.approx(1.5)


def test_static_masks_hold_even_when_the_other_side_is_idle():
    events, g, usage, done = gpu("static", static_encoder_fraction=0.25)
    g.start_encode(0.5, 1, 100, 0, mark(done, events), "encode")
    events.run()
    assert done["encode"] == pytest.approx(2.0)
    g.start_prefill(0.75, mark(done, events), "prefill")
    events.run()
    assert done["prefill"] == pytest.approx(2.0 + 1.0)


def test_dynamic_split_is_per_micro_batch():
    events, g, _, done = gpu("dynamic", min_share=0.0)
    # Encoder work 3000 tokens vs a backlog of 1000: 48 of 64 TPCs for the encoder, 16 for prefill.
    g.start_prefill(0.5, mark(done, events), "prefill")
    g.start_encode(0.75, 4, 3000, 1000, mark(done, events), "encode")
    events.run()
    assert done["encode"] == pytest.approx(1.0)                  # 0.75 s of work at 3/4 of the GPU
    assert done["prefill"] == pytest.approx(1.0 + (0.5 - 0.25))  # 1/4 speed until 1.0, then all of it
    # A batch split with no backlog gives prefill nothing until it ends: a prefill started meanwhile waits.
    events2, g2, _, done2 = gpu("dynamic")
    g2.start_encode(1.0, 1, 100, 0, mark(done2, events2), "encode")
    events2.at(0.5, lambda _: g2.start_prefill(0.25, mark(done2, events2), "prefill"))
    events2.run()
    assert done2 == pytest.approx({"encode": 1.0, "prefill": 1.25})


def test_an_e_p_gpu_must_leave_prefill_a_tpc():
    with pytest.raises(ValueError, match="total_tpcs=1"):
        SharedGPU(EventQueue(), SMPartition(1, SMPartitionConfig(mode="static")), NodeUsage("ep", "l4", "E+P"))


def test_event_queue_orders_by_time_then_by_scheduling_order():
    events, seen = EventQueue(), []
    for t, name in ((2.0, "c"), (1.0, "a"), (2.0, "d"), (1.0, "b")):
        events.at(t, seen.append, name)
    events.run()
    assert seen == ["a", "b", "c", "d"] and events.now == 2.0 and events.processed == 4
    with pytest.raises(ValueError, match="past"):
        events.at(1.0, seen.append, "late")
