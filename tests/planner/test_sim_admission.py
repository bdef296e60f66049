"""A request admitted to a running batch holds the batch up between steps (ProfileOverheads.admit_s, measured by
the profiler's admission phase): PerfModel charges what the admitting step does not already carry, the simulator
adds it to that step and takes it off the tensors' hop (the request pays it once)."""

from __future__ import annotations

import pytest

from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import RequestRecord
from coordinator.planner.perf import PerfModel
from coordinator.planner.profiling_admission import AdmissionSample, admit_s
from coordinator.planner.sim_engine import EngineModel, Flight
from coordinator.planner.workload import SimRequest
from tests.planner.overhead_profiles import TINY, profile, run


def test_the_charge_is_the_measured_admission_less_what_the_prefill_step_carries():
    perf = PerfModel(load_catalog(), TINY, [profile(prefill_step_s=0.004, decode_step_s=0.0005, admit_s=0.006)])
    assert perf.admit_s("cpu") == pytest.approx(0.006 - 0.0035)          # a prefilling engine's step has 3.5 ms
    assert perf.admit_s("cpu", "decode") == pytest.approx(0.006)          # a KV join has no prefill step
    small = PerfModel(load_catalog(), TINY, [profile(prefill_step_s=0.004, admit_s=0.002)])
    assert small.admit_s("cpu") == 0.0 and small.admit_s("cpu", "decode") == pytest.approx(0.002)
    assert PerfModel(load_catalog(), TINY, [profile(admit_s=0.006)], overheads=False).admit_s("cpu") == 0.0
    assert PerfModel(load_catalog(), TINY, [profile(admit_s=0.006)]).admit_s("A100-80GB") == 0.0  # roofline tier


def test_the_profilers_figure_is_the_median_added_gap_per_join():
    samples = [AdmissionSample(2, 0.010, 0.016), AdmissionSample(2, 0.010, 0.020), AdmissionSample(1, 0.012, 0.010)]
    assert [s.admit_s for s in samples] == pytest.approx([0.003, 0.005, 0.0])   # noise below the lone gap: 0
    assert admit_s(samples) == pytest.approx(0.003) and admit_s([]) == 0.0


def test_a_step_counts_the_sequences_it_admits():
    def flight(i: int, produced: int = 0) -> Flight:
        return Flight(RequestRecord(SimRequest(i, 0.0, "image", 1, 196, 10, 8)), prompt=206, produced=produced)

    combined = EngineModel("combined", max_num_seqs=8, max_num_batched_tokens=4096)
    for i in range(3):
        combined.add(flight(i))
    assert combined.schedule().admitted == 3
    decode = EngineModel("decode", max_num_seqs=2, max_num_batched_tokens=4096)
    for i in range(3):
        decode.add(flight(i, produced=1))
    plan = decode.schedule()
    assert plan.admitted == 2 and not plan.prefills        # two joins fill the batch; none is prefilled here


@pytest.mark.parametrize("spec, role", [("E@cpu, P+D@cpu", "combined"), ("E@cpu, P@cpu, D@cpu", "decode")])
def test_a_join_holds_up_the_running_batch_by_the_charge(spec, role):
    """A decodes 60 tokens; B (two tokens) joins while it does. With the admission measured, A finishes later by
    exactly the charge of B's join (B's own steps lie inside A's life either way); on E, P, D A's own join to D
    is charged too, before it decodes."""
    requests = [SimRequest(0, 0.0, "image", 1, 196, 10, 60), SimRequest(1, 0.08, "image", 1, 196, 10, 2)]
    base = dict(hop_s=0.001, prefill_step_s=0.002, decode_step_s=0.0005)
    perf, before = run(spec, profile(**base), requests)
    perf_on, after = run(spec, profile(**base, admit_s=0.007), requests)
    charge = perf_on.admit_s("cpu", role)
    assert charge > 0.0
    assert before[1].first_token < before[0].finish                       # B joined while A decoded
    # A's own join to its prefilling engine: its embeddings' hop less the charge, then the charge in the step
    prefill_charge = perf_on.admit_s("cpu", "prefill")
    hop = perf.transfer_s(196 * TINY.embedding_bytes(1), "cpu", "cpu", False)
    assert after[0].first_token - before[0].first_token == pytest.approx(
        prefill_charge - min(hop, prefill_charge), abs=1e-6)
    decoding = (after[0].finish - after[0].first_token) - (before[0].finish - before[0].first_token)
    if role == "decode":  # A's KV joins D (its hop less the charge, then the charge), and B's KV holds A up
        kv_hop = perf.transfer_s(206 * TINY.kv_bytes_per_token(), "cpu", "cpu", False)
        assert decoding == pytest.approx(2 * charge - min(kv_hop, charge), abs=1e-6)
    else:  # B's join holds A up once
        assert decoding == pytest.approx(charge, abs=1e-6)


def test_without_a_measured_admission_nothing_moves():
    requests = [SimRequest(i, 0.02 * i, "image", 1, 196, 10, 20) for i in range(6)]
    _, a = run("E@cpu, P+D@cpu", profile(hop_s=0.001), requests)
    _, b = run("E@cpu, P+D@cpu", profile(hop_s=0.001, admit_s=0.0), requests)
    assert [(r.first_token, r.finish) for r in a] == [(r.first_token, r.finish) for r in b]
