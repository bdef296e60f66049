"""Simulator(record_compute=True) sums the workers' compute as live workers report it (sim_compute.py): each
forward without overheads, at its own length, once per request in it."""

from __future__ import annotations

import pytest

from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import Profile, ProfileOverheads
from coordinator.planner.sim import Simulator
from coordinator.planner.sim_compute import ComputeMeter
from coordinator.planner.workload import SimRequest

TINY = get_arch("tiny-llava")
PROFILE = Profile(tier="cpu", model="tiny-llava", measured_at="2026-12-06",
                  encode={"image": {"tokens_per_item": 196, "points": [{"batch": 1, "seconds": 0.01},
                                                                         {"batch": 2, "seconds": 0.016}]}},
                  prefill=[{"tokens": 100, "seconds": 0.01}, {"tokens": 400, "seconds": 0.03}],
                  decode=[{"batch": 1, "context_tokens": 100, "seconds": 0.003},
                          {"batch": 4, "context_tokens": 1600, "seconds": 0.005}],
                  overheads=ProfileOverheads(encode_batch_s=0.002, prefill_step_s=0.003, decode_step_s=0.0005,
                                             decode_seq_s=0.0001, hop_s=0.001))


def simulate(requests, spec="E@cpu, P+D@cpu", profile=PROFILE, **kw):
    perf = PerfModel(load_catalog(), TINY, [profile])
    sim = Simulator(Deployment.parse(spec), perf, kv_bytes_per_token=TINY.kv_bytes_per_token(),
                    embedding_bytes_per_token=TINY.embedding_bytes(1), record_compute=True, **kw)
    return perf, sim.run(requests)


def test_one_request_counts_its_forwards_without_the_overheads():
    n = 6
    perf, result = simulate([SimRequest(0, 0.0, "image", 1, 196, 10, n)])
    bare = perf.without_overheads()
    prompt = 206
    assert result.compute_s["encode"] == pytest.approx(bare.encode_s("cpu", "image", 1, 196))
    assert result.compute_s["prefill"] == pytest.approx(bare.prefill_s("cpu", prompt))
    # n - 1 decode steps, the k-th over prompt + k tokens of cache
    assert result.compute_s["decode"] == pytest.approx(sum(bare.decode_step_s("cpu", 1, prompt + k) for k in range(1, n)))
    assert bare.decode_step_s("cpu", 1, 100) < perf.decode_step_s("cpu", 1, 100)   # the overheads are left out


def test_a_shared_step_counts_once_per_request_and_coasting_changes_nothing():
    requests = [SimRequest(i, 0.001 * i, "image", 1, 196, 10, 30) for i in range(4)]
    _, coasting = simulate(requests)
    _, stepping = simulate(requests, coast=False)
    assert coasting.compute_s == pytest.approx(stepping.compute_s)
    _, alone = simulate(requests[:1])
    assert coasting.compute_s["decode"] > 3 * alone.compute_s["decode"]   # four decoding together count four times


def test_each_request_keeps_the_decode_steps_it_was_in_and_they_add_up_to_the_total():
    """Staggered requests, different lengths: each one's decode_s is the forwards of the steps it decoded in, by
    hand for the first alone; summed they are the request-weighted total, coasting or stepping, on a combined engine
    (where a decoding sequence is charged the whole step, the prefills beside it too, as live) or after a hand-off
    to a decode engine."""
    requests = [SimRequest(0, 0.0, "image", 1, 196, 10, 30), SimRequest(1, 0.02, "image", 1, 196, 10, 12),
                SimRequest(2, 0.05, "image", 1, 196, 10, 1), SimRequest(3, 0.06, "image", 1, 196, 10, 20)]
    for spec in ("E@cpu, P+D@cpu", "E@cpu, P@cpu, D@cpu"):
        for coast in (True, False):
            _, result = simulate(requests, spec=spec, coast=coast)
            per_request = result.decode_compute_s
            assert sorted(per_request) == [0, 1, 3]   # request 2 answers with its first token: it never decodes
            assert sum(per_request.values()) == pytest.approx(result.compute_s["decode"])
            assert all(v > 0 for v in per_request.values())
    perf, alone = simulate(requests[:1])
    bare, prompt = perf.without_overheads(), 206
    assert alone.decode_compute_s[0] == pytest.approx(sum(bare.decode_step_s("cpu", 1, prompt + k) for k in range(1, 30)))
    _, together = simulate(requests[:2])
    assert together.decode_compute_s[0] > alone.decode_compute_s[0]   # its steps beside request 1 decode two
    assert sum(together.decode_compute_s.values()) == pytest.approx(together.compute_s["decode"])


def test_a_forward_on_a_shared_core_counts_at_its_own_length_unless_stretched():
    """E and P+D time-slice one core: while B is encoded A's steps take longer on the wall. By default each forward
    counts at its own length, so the sums are those of the unshared run; with compute_stretched at its wall length,
    as a live timer around it would see it: B's encode and the steps beside it count longer, the rest the same."""
    requests = [SimRequest(0, 0.0, "image", 1, 196, 10, 40), SimRequest(1, 0.05, "image", 1, 196, 10, 2)]
    _, own = simulate(requests)
    _, shared = simulate(requests, shared_cores=[{"0-E-cpu", "1-P+D-cpu"}])
    assert shared.records[0].finish > own.records[0].finish            # the sharing is simulated
    assert shared.compute_s == pytest.approx(own.compute_s)
    _, stretched = simulate(requests, shared_cores=[{"0-E-cpu", "1-P+D-cpu"}], compute_stretched=True)
    _, alone_stretched = simulate(requests, compute_stretched=True)
    assert alone_stretched.compute_s == pytest.approx(own.compute_s)   # nothing to stretch on cores of their own
    assert stretched.compute_s["encode"] > own.compute_s["encode"]
    assert stretched.compute_s["decode"] > own.compute_s["decode"]
    extra = stretched.compute_s["encode"] - own.compute_s["encode"]
    # B's encode (10 ms + the 2 ms batch overhead of work) ran at half the core beside A's steps: its 10 ms forward
    # counts up to twice (A's steps stop and start inside it), never more
    assert 0.0 < extra <= own.compute_s["encode"] / 2 + 1e-9


def test_service_times_that_cannot_drop_their_overheads_are_refused():
    class Table:
        def encode_s(self, *a): return 0.01
        def prefill_s(self, *a): return 0.01
        def decode_step_s(self, *a): return 0.002
        def transfer_s(self, *a): return 0.0

    sim = Simulator(Deployment.parse("E@cpu, P+D@cpu"), Table(), kv_bytes_per_token=1, embedding_bytes_per_token=1,
                    record_compute=True)
    with pytest.raises(ValueError, match="without_overheads"):
        sim.run([SimRequest(0, 0.0, "image", 1, 196, 10, 4)])
    assert Simulator(Deployment.parse("E@cpu, P+D@cpu"), Table(), kv_bytes_per_token=1,
                     embedding_bytes_per_token=1).run([SimRequest(0, 0.0, "image", 1, 196, 10, 4)]).compute_s == {}


def test_a_share_of_the_stretch_counts_that_share_of_what_the_sharing_added():
    """compute_stretched = 0.25 counts each time-sliced forward at its own length plus a quarter of what the sharing
    added on the wall: a quarter of the full stretch's extra (the simulation itself is the same)."""
    requests = [SimRequest(0, 0.0, "image", 1, 196, 10, 40), SimRequest(1, 0.05, "image", 1, 196, 10, 2)]
    core = [{"0-E-cpu", "1-P+D-cpu"}]
    _, own = simulate(requests, shared_cores=core)
    _, full = simulate(requests, shared_cores=core, compute_stretched=1.0)
    _, quarter = simulate(requests, shared_cores=core, compute_stretched=0.25)
    for stage in ("encode", "decode"):
        extra = full.compute_s[stage] - own.compute_s[stage]
        assert extra > 0
        assert quarter.compute_s[stage] - own.compute_s[stage] == pytest.approx(extra / 4)
    assert [r.finish for r in quarter.records] == [r.finish for r in own.records]
    with pytest.raises(ValueError, match=r"compute_stretched must be in \[0, 1\]"):
        simulate(requests, compute_stretched=1.5)


def test_the_stack_s_part_of_a_stretch_counts_at_its_own_share():
    """compute_stack_stretched counts the part of a forward's stretch the stack's jobs caused at its own share:
    with the stack on the encode worker's core (its only other job there), the encoder's stretch is all the stack's,
    so stretched 0 / stack 1 counts it as stretched 1 does, and stretched 1 / stack 0 as stretched 0 does."""
    requests = [SimRequest(i, 0.004 * i, "image", 1, 196, 10, 8) for i in range(6)]
    busy_stack = PROFILE.model_copy(update={"overheads": PROFILE.overheads.model_copy(
        update={"request_latency_s": 0.004, "stack_cpu_request_s": 0.005, "stack_cpu_token_s": 0.001})})
    stack = {"stack_cores": {"0-E-cpu": 1.0}, "stack_placement": "idlest", "profile": busy_stack}
    _, own = simulate(requests, **stack)
    _, full = simulate(requests, compute_stretched=1.0, **stack)
    _, stack_only = simulate(requests, compute_stretched=0.0, compute_stack_stretched=1.0, **stack)
    _, workers_only = simulate(requests, compute_stretched=1.0, compute_stack_stretched=0.0, **stack)
    assert full.compute_s["encode"] > own.compute_s["encode"]          # the stack's jobs did stretch the encoder
    assert stack_only.compute_s["encode"] == pytest.approx(full.compute_s["encode"])
    assert workers_only.compute_s["encode"] == pytest.approx(own.compute_s["encode"])
    meter = ComputeMeter(PerfModel(load_catalog(), TINY, [PROFILE]), stretched=0.2, stack_stretched=0.6)
    # 10 ms of work over 16 ms of wall, 4 ms of the 6 ms added by the stack: 1 + (0.2 x 2 + 0.6 x 4) / 10
    assert meter.stretch(0.0, 0.016, 0.010, 0.004) == pytest.approx(1.28)
    assert meter.stretch(0.0, 0.016, 0.010, 0.009) == pytest.approx(1.36)   # never more than what was added
    with pytest.raises(ValueError, match="stack_stretched"):
        ComputeMeter(PerfModel(load_catalog(), TINY, [PROFILE]), stack_stretched=1.2)
