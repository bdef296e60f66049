"""Rebuilt decode batches: the reference engine reuses a decode step's padded cache only while the same
sequences go on (llm_node/kv.py DecodeBatches); the simulator marks the other decode steps and prices them
with ServiceTimes.decode_rebuild_s (PerfModel: the profile's decode_rebuild_token_s)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from test_sim import MIXED, MIXED_KNOBS, MIXED_TABLE, Table, fingerprint, mixed_requests, simulate

from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import RequestRecord
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import DecodePoint, PrefillPoint, Profile, ProfileOverheads
from coordinator.planner.sim_engine import EngineModel, Flight
from coordinator.planner.workload import SimRequest


def flight(rid: int, prompt: int, out: int, produced: int = 0) -> Flight:
    return Flight(RequestRecord(SimRequest(rid, 0.0, "image", 1, prompt, 0, out)), prompt, produced)


@dataclass(frozen=True)
class RebuildTable(Table):
    rebuild_per_context: float = 0.0

    def decode_rebuild_s(self, tier, batch, context_tokens):
        return self.rebuild_per_context * context_tokens


# --- the engine model --------------------------------------------------------------------------------

def test_a_decode_worker_rebuilds_when_a_sequence_joins_or_leaves_and_after_idling():
    e = EngineModel("decode", 8, 1000, padded=True)
    e.add(flight(0, 100, 4, produced=1))  # decodes 3 tokens: steps 0, 1, 2
    marks = []
    for _ in range(2):
        plan = e.schedule()
        marks.append(plan.decode_rebuild)
        e.complete(plan)
    e.add(flight(1, 50, 4, produced=1))  # joins at step 2, A's last
    for _ in range(3):
        plan = e.schedule()
        marks.append(plan.decode_rebuild)
        e.complete(plan)
    assert marks == [True, False, True, True, False]  # join; same; join; A left; same
    assert not e.has_work()
    e.add(flight(2, 10, 3, produced=1))
    assert e.schedule().decode_rebuild  # the engine idled (it drops its kept batch)


def test_a_combined_engine_rebuilds_after_a_prefill_joins_the_decodes():
    e = EngineModel("combined", 8, 1000, padded=True)
    e.add(flight(0, 100, 6))
    plan = e.schedule()
    assert plan.prefills and not plan.decode_rebuild  # no decodes: nothing to rebuild
    e.complete(plan)
    plan = e.schedule()
    assert plan.decode_rebuild
    e.complete(plan)
    assert e.plain_decode_step() == (1, 102) and not e.last_rebuild


def test_rewinding_plain_steps_restores_whether_the_next_step_rebuilds():
    e = EngineModel("combined", 8, 1000, padded=True)
    e.add(flight(0, 100, 3))
    e.add(flight(1, 40, 8))
    e.complete(e.schedule())
    e.complete(e.schedule())
    e.complete(e.schedule())  # the 100-token prompt finishes here: the next step rebuilds
    first = e.step_index
    assert e.plain_decode_step() is not None and e.last_rebuild
    assert e.plain_decode_step() is not None and not e.last_rebuild
    e.plain_decode_step()
    e.rewind(first + 1)  # the rebuilt step stays: the one after it reuses
    assert e.plain_decode_step() is not None and not e.last_rebuild
    e.rewind(first)  # the rebuilt step is forgotten: planned again, it rebuilds again
    assert e.plain_decode_step() is not None and e.last_rebuild


class Naive:
    """The reference engine's reuse rule, literally: a step reuses iff the previous step decoded exactly
    the sequences this one decodes."""

    def __init__(self, role: str, max_num_seqs: int, max_tokens: int) -> None:
        self.role, self.max_num_seqs, self.max_tokens = role, max_num_seqs, max_tokens
        self.waiting: list[list[int]] = []  # [rid, prompt, tokens left to produce]
        self.running: list[list[int]] = []
        self.previous: tuple[int, ...] = ()

    def step(self) -> bool:
        decodes = [s for s in self.running]
        budget = self.max_tokens - len(decodes)
        prefills = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            cost = 1 if self.role == "decode" else self.waiting[0][1]
            if cost > budget:
                break
            budget -= cost
            seq = self.waiting.pop(0)
            self.running.append(seq)
            (decodes if self.role == "decode" else prefills).append(seq)
        ids = tuple(s[0] for s in decodes)
        rebuild = bool(ids) and ids != self.previous
        self.previous = ids
        for s in decodes + prefills:
            s[2] -= 1
            if s[2] == 0:
                self.running.remove(s)
        return rebuild


@pytest.mark.parametrize("role", ["combined", "decode"])
@pytest.mark.parametrize("seed", range(3))
def test_rebuild_marks_match_the_naive_engine_step_for_step(role, seed):
    rng = random.Random(seed)
    fast, naive = EngineModel(role, 6, 400, padded=True), Naive(role, 6, 400)
    rid = rebuilt = reused = 0
    for _ in range(3000):
        for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):
            prompt, out = rng.randint(1, 200), rng.randint(2, 30)
            produced = 1 if role == "decode" else 0
            fast.add(flight(rid, prompt, out, produced))
            naive.waiting.append([rid, prompt, out - produced])
            rid += 1
        if not fast.has_work():
            naive.previous = ()  # idle: the engine drops its kept batch
            continue
        if rng.random() < 0.5 and fast.plain_decode_step() is not None:
            rebuild = fast.last_rebuild
        else:
            plan = fast.schedule()
            fast.complete(plan)
            rebuild = plan.decode_rebuild
        assert naive.step() == rebuild
        rebuilt += rebuild
        reused += not rebuild
    assert rebuilt > 300 and reused > 300


# --- the simulator and the performance model ---------------------------------------------------------

def test_a_rebuilt_step_costs_its_padded_context_on_top():
    """One request on a decode worker: its first decode step pads afresh, the others reuse."""
    table = RebuildTable(encode=0.010, transfer=0.0, prefill=0.010, decode=0.001, decode_per_context=0.0,
                         rebuild_per_context=1e-5)
    req = [SimRequest(0, 0.0, "image", 1, 100, 0, 4)]  # 100 prompt tokens + the first token: context 101
    base = simulate("E@l4, P@a100, D@h100", Table(encode=0.010, transfer=0.0, prefill=0.010, decode=0.001),
                    req).records[0]
    rec = simulate("E@l4, P@a100, D@h100", table, req).records[0]
    assert rec.first_token == base.first_token
    assert rec.finish - base.finish == pytest.approx(1e-5 * 101)  # the first decode step only


@pytest.mark.parametrize("coast", [True, False])
def test_coasting_prices_rebuilds_as_stepping_does(coast):
    table = RebuildTable(**{k: getattr(MIXED_TABLE, k) for k in ("encode", "encode_per_item", "prefill",
                            "prefill_per_token", "decode", "decode_per_seq", "decode_per_context", "transfer",
                            "bytes_per_s", "slow")}, rebuild_per_context=2e-6)
    from coordinator.planner.deployment import Deployment
    from coordinator.planner.sim import Simulator
    requests = mixed_requests(300, 4)
    runs = [Simulator(Deployment.parse(MIXED, **MIXED_KNOBS), t, kv_bytes_per_token=1000, embedding_bytes_per_token=100,
                      coast=c).run(requests) for t, c in ((table, coast), (table, not coast), (MIXED_TABLE, coast))]
    rounded = [[tuple(round(x, 9) if isinstance(x, float) else x for x in row) for row in fingerprint(r)] for r in runs]
    assert rounded[0] == rounded[1]
    slower = [a.finish - b.finish for a, b in zip(runs[0].records, runs[2].records)]
    assert sum(slower) > 0  # priced (routing moves some requests either way)


def _profile(rebuild_token_s: float) -> Profile:
    return Profile(tier="cpu", model="tiny-llava", measured_at="now", prefill=(PrefillPoint(tokens=100, seconds=0.01),),
                   decode=(DecodePoint(batch=1, context_tokens=100, seconds=0.003),),
                   overheads=ProfileOverheads(decode_step_s=0.001, decode_rebuild_token_s=rebuild_token_s))


def test_perf_model_prices_a_rebuild_per_padded_token_with_or_without_overheads():
    arch = get_arch("tiny-llava")
    for overheads in (True, False):
        perf = PerfModel(load_catalog(), arch, [_profile(1e-6)], overheads=overheads)
        assert perf.decode_rebuild_s("cpu", 2, 600) == pytest.approx(6e-4)
    assert PerfModel(load_catalog(), arch, [_profile(0.0)]).decode_rebuild_s("cpu", 2, 600) == 0.0
    assert PerfModel(load_catalog(), arch, []).decode_rebuild_s("h100", 2, 600) == 0.0
