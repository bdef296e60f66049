"""A prefill step over several sequences is timed as a batch (each sequence its own causal attention, the step's
fixed part once), not as one prompt of all their tokens (Profile/PerfModel.prefill_batch_s, sim_llm)."""

from __future__ import annotations

import pytest

from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment, EngineLimits
from coordinator.planner.perf import PerfModel, prefill_batch_cost, prefill_cost
from coordinator.planner.profile import DecodePoint, EncodeCurve, EncodePoint, PrefillPoint, Profile
from coordinator.planner.sim import Simulator
from coordinator.planner.workload import SimRequest

LLAVA = get_arch("llava-1.5-7b")


def profile() -> Profile:
    """Single prompts: 2 ms at 32 tokens, 4 ms at 128, 20 ms at 512 (superlinear, as attention makes it)."""
    return Profile(tier="cpu", model="tiny-llava", measured_at="2026-12-06T15:00:00Z",
                   encode={"image": EncodeCurve(tokens_per_item=196, points=(EncodePoint(batch=1, seconds=0.003),))},
                   prefill=(PrefillPoint(tokens=32, seconds=0.002), PrefillPoint(tokens=128, seconds=0.004),
                            PrefillPoint(tokens=512, seconds=0.020)),
                   decode=(DecodePoint(batch=1, context_tokens=48, seconds=0.002),))


def test_the_fixed_part_is_the_line_through_the_two_shortest_prompts_at_zero_tokens():
    assert profile().prefill_fixed_s == pytest.approx(0.002 - 32 * 0.002 / 96)  # 1.333 ms


def test_eight_prompts_cost_eight_times_their_own_part_and_the_fixed_part_once():
    p = profile()
    one = 0.004 + (315 - 128) * 0.016 / 384  # 11.79 ms, on the polyline
    assert p.prefill_s(315) == pytest.approx(one)
    fixed = p.prefill_fixed_s
    assert p.prefill_batch_s([315] * 8) == pytest.approx(one + 7 * (one - fixed))  # 85.0 ms
    assert p.prefill_batch_s([315] * 8) < 0.85 * p.prefill_s(8 * 315)  # one 2520-token prompt: 104 ms
    assert p.prefill_batch_s([315]) == pytest.approx(one)
    assert p.prefill_batch_s([512, 32]) == pytest.approx(0.020 + 0.002 - fixed)


def test_perf_model_batches_measured_and_roofline_prefills():
    perf = PerfModel(load_catalog(), get_arch("tiny-llava"), [profile()])
    assert perf.prefill_batch_s("cpu", [315]) == perf.prefill_s("cpu", 315)
    assert perf.prefill_batch_s("cpu", [315] * 8) == pytest.approx(profile().prefill_batch_s([315] * 8))
    gpu = PerfModel(load_catalog(), LLAVA)
    flops, nbytes = prefill_batch_cost(LLAVA, [1000, 1000])
    one_f, one_b = prefill_cost(LLAVA, 1000)
    assert flops == pytest.approx(2 * one_f) and nbytes == pytest.approx(2 * one_b - LLAVA.llm_weight_bytes())
    assert flops < prefill_cost(LLAVA, 2000)[0]  # two attentions of 1000, not one of 2000
    assert gpu.prefill_batch_s("A100-80GB", [1000, 1000]) < gpu.prefill_s("A100-80GB", 2000)
    assert gpu.prefill_batch_s("A100-80GB[fp8/tp2]", [1000, 1000]) < gpu.prefill_s("A100-80GB[fp8/tp2]", 2000)


class OnePrompt:
    """`perf` without prefill_batch_s: a step's prompts timed as one prompt of all their tokens (the old reading).
    Without under_load too, whose view of the model would bring prefill_batch_s back."""

    def __init__(self, perf: PerfModel) -> None:
        self.perf = perf

    def __getattr__(self, name: str):
        if name in ("prefill_batch_s", "under_load"):
            raise AttributeError(name)
        return getattr(self.perf, name)


def test_the_simulator_times_a_padded_step_of_two_prompts_as_a_batch():
    """Two requests queue at the combined node behind a long prefill and are admitted in one step, padded to the
    longer prompt: that step is shorter than one prompt of both their tokens, by exactly the two readings' gap."""
    perf = PerfModel(load_catalog(), get_arch("tiny-llava"), [profile()])
    dep = Deployment.parse("E@cpu, P+D@cpu", engine=EngineLimits(max_num_seqs=8, max_num_batched_tokens=4096,
                                                                  pad_to_longest=True))
    reqs = [SimRequest(0, 0.0, "image", 1, 196, 600, 2), SimRequest(1, 0.001, "image", 1, 196, 104, 2),
            SimRequest(2, 0.002, "image", 1, 196, 4, 2)]  # prompts 796, 300, 200

    def run(service):
        sim = Simulator(dep, service, kv_bytes_per_token=1000, embedding_bytes_per_token=100)
        return sim.run(reqs).records

    batched, one = run(perf), run(OnePrompt(perf))
    assert batched[1].prefill_start == batched[2].prefill_start > batched[0].first_token - 1e-9
    gap = perf.prefill_s("cpu", 600) - perf.prefill_batch_s("cpu", [300, 300])
    assert gap > 0.002  # 2.7 ms: 600 tokens extrapolate past the 512-token point
    for b, o in zip(batched[1:], one[1:]):
        assert o.first_token - b.first_token == pytest.approx(gap, rel=1e-6)
