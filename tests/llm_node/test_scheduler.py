"""Scheduler limits, FCFS order, roles and aborts, on sequences without a model."""

from __future__ import annotations

import pytest
import torch

from coordinator.protocol.messages import SamplingParams
from llm_node.engine import EngineConfig
from llm_node.kv import SequenceKV
from llm_node.scheduler import Scheduler
from llm_node.sequence import Sequence, SequenceStatus


@pytest.fixture
def make_seq():
    def build(request_id: str, prompt_len: int, imported: bool = False) -> Sequence:
        seq = Sequence(request_id, list(range(prompt_len)), SamplingParams(), detokenizer=None)
        if imported:  # a decode-role sequence: KV of prompt + 1 produced token - 1
            seq.kv = SequenceKV(torch.zeros(1, 2, 1, prompt_len, 4))
            seq.output_ids = [7]
        return seq

    return build


def _ids(seqs):
    return [s.request_id for s in seqs]


def test_max_num_seqs_bounds_running(make_seq):
    sched = Scheduler(EngineConfig(max_num_seqs=2, max_num_batched_tokens=100))
    for i in range(4):
        sched.add(make_seq(f"r{i}", 5))
    plan = sched.schedule()
    assert _ids(plan.prefills) == ["r0", "r1"] and plan.decodes == []
    plan = sched.schedule()
    assert plan.prefills == [] and _ids(plan.decodes) == ["r0", "r1"]
    sched.after_step(plan.decodes[0], was_prefill=False, finished=True)
    plan = sched.schedule()
    assert _ids(plan.decodes) == ["r1"] and _ids(plan.prefills) == ["r2"]


def test_token_budget_counts_prompts_and_decodes(make_seq):
    sched = Scheduler(EngineConfig(max_num_seqs=8, max_num_batched_tokens=20))
    for i, n in enumerate([8, 8, 8]):
        sched.add(make_seq(f"r{i}", n))
    plan = sched.schedule()
    assert _ids(plan.prefills) == ["r0", "r1"] and plan.num_tokens == 16
    plan = sched.schedule()  # 2 decodes leave 18 tokens: r2 fits
    assert _ids(plan.decodes) == ["r0", "r1"] and _ids(plan.prefills) == ["r2"] and plan.num_tokens == 10


def test_fcfs_never_skips_the_queue_head(make_seq):
    sched = Scheduler(EngineConfig(max_num_seqs=8, max_num_batched_tokens=20))
    sched.add(make_seq("short", 5))
    sched.add(make_seq("long", 18))
    sched.add(make_seq("tiny", 1))
    assert _ids(sched.schedule().prefills) == ["short"]
    plan = sched.schedule()  # 1 decode + 18 = 19 tokens; "tiny" would fit only by overtaking before
    assert _ids(plan.prefills) == ["long", "tiny"]


def test_imported_sequences_only_need_a_slot(make_seq):
    sched = Scheduler(EngineConfig(role="decode", max_num_seqs=2, max_num_batched_tokens=2))
    for i in range(3):
        sched.add(make_seq(f"d{i}", 50, imported=True))
    plan = sched.schedule()
    assert plan.prefills == [] and _ids(plan.decodes) == ["d0", "d1"]
    assert sched.waiting[0].status is SequenceStatus.WAITING


@pytest.mark.parametrize("role, handoff", [("combined", False), ("prefill", True)])
def test_role_decides_what_follows_a_prefill(make_seq, role, handoff):
    sched = Scheduler(EngineConfig(role=role))
    sched.add(make_seq("r", 4))
    (seq,) = sched.schedule().prefills
    assert sched.after_step(seq, was_prefill=True, finished=False) is handoff
    assert (seq in sched.running) is not handoff


def test_prefill_role_does_not_hand_off_a_finished_sequence(make_seq):
    sched = Scheduler(EngineConfig(role="prefill"))
    sched.add(make_seq("r", 4))
    (seq,) = sched.schedule().prefills
    assert sched.after_step(seq, was_prefill=True, finished=True) is False
    assert not sched.has_unfinished() and seq.status is SequenceStatus.FINISHED


def test_abort_removes_from_either_queue(make_seq):
    sched = Scheduler(EngineConfig(max_num_seqs=1))
    sched.add(make_seq("a", 3))
    sched.add(make_seq("b", 3))
    sched.schedule()
    assert sched.abort("b").request_id == "b" and sched.abort("a").request_id == "a"
    assert sched.abort("a") is None
    assert not sched.has_unfinished() and sched.schedule().is_empty
