"""Knob spaces, their policy mapping, and the simulator trial backend; plus the planning pipeline's stage 1."""

from __future__ import annotations

import pytest
from plan_factories import space

from coordinator.planner.allocation import parse_allocation
from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import SLO
from coordinator.planner.planning import (
    PlanError,
    PlanRequest,
    baseline_spaces,
    has_spaces,
    prepare,
)
from coordinator.planner.scenarios import default_workload, engine_limits, mean_shape
from coordinator.planner.space import SPLITS, Knobs, KnobSpace, TrialConfig, can_steal
from coordinator.planner.trials import allocation_nodes

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)


def test_knobs_map_onto_the_coordinators_policy():
    p = Knobs(batch=1).policy()
    assert p.batch.name == "pass_through" and p.batch.max_batch == 1 and not p.stealing.enabled
    p = Knobs(batch=4, s=0.3, split="static-0.25", stealing=True).policy()
    assert (p.batch.name, p.batch.max_batch, p.offload.s) == ("adaptive", 4, 0.3)
    assert (p.partition.mode, p.partition.static_encoder_fraction, p.stealing.enabled) == ("static", 0.25, True)
    assert Knobs(batch=2, split="none").policy().partition.mode == "none"


def test_space_seed_clip_sample_and_sweep_values():
    import numpy as np

    sp = space("1xL4:E+P,1xL4:P,1xL4:D", b_max=3, s_range=(0.2, 0.6), s_star=0.9)
    assert sp.seed() == Knobs(batch=3, s=0.6)  # s* clipped into its window
    assert sp.clip(Knobs(batch=9, s=0.0, split="none", stealing=True)) == Knobs(batch=3, s=0.2, split="none")
    assert sp.values("batch") == [1, 2, 3] and sp.values("s") == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6])
    assert sp.values("split") == list(SPLITS) and sp.values("stealing") == []
    rng = np.random.default_rng(0)
    for _ in range(50):
        k = sp.sample(rng)
        assert 1 <= k.batch <= 3 and 0.2 <= k.s <= 0.6 and not k.stealing
    plain = space("1xL4:E,1xL4:P+D", b_max=16)
    assert plain.values("s") == [] and plain.values("split") == [] and plain.values("batch") == [1, 5, 8, 12, 16]
    with pytest.raises(ValueError, match="unknown knob"):
        plain.values("gamma")


def test_s_is_a_knob_only_with_local_and_remote_prefill():
    with pytest.raises(ValueError, match="s_range"):
        KnobSpace(allocation=parse_allocation("1xL4:E,1xL4:P+D"), b_max=2, s_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="s_range"):
        KnobSpace(allocation=parse_allocation("1xL4:E+P,1xL4:P,1xL4:D"), b_max=2)
    alone = KnobSpace(allocation=parse_allocation("1xL4:E+P,1xL4:D"), b_max=2)  # every prefill is local
    assert alone.seed() == Knobs(batch=2, s=1.0) and alone.values("s") == [] and alone.values("split") == list(SPLITS)


def test_stealing_needs_an_e_gpu_that_holds_the_llm():
    alloc = parse_allocation("1xL4:E,1xL4:P+D")
    assert can_steal(alloc, lambda tier, role: True)
    assert not can_steal(alloc, lambda tier, role: role != "E+P")
    assert not can_steal(parse_allocation("1xL4:E+P,1xL4:D"), None)


def test_allocation_nodes_are_numbered_per_host_with_the_tiers_tpcs():
    catalog = load_catalog()
    nodes = allocation_nodes(catalog, parse_allocation("2xRTX4090:E,1xA100:P+D", catalog), "h1")
    assert [(n.name, n.tier, n.role, n.tpcs) for n in nodes] == [
        ("h1/gpu0", "RTX4090", "E", 64), ("h1/gpu1", "RTX4090", "E", 64), ("h1/gpu2", "A100-80GB", "P+D", 54)]


def test_engine_sequences_are_capped_by_kv_memory():
    catalog, arch = load_catalog(), get_arch("llava-v1.6-34b")
    shape = mean_shape(default_workload(arch, "image", 2.0))
    small = engine_limits(catalog, arch, shape, ["A100-80GB"], longest_prompt=3000)
    assert 1 <= small.max_num_seqs <= 6  # 69 GB of weights leave room for a handful of ~0.7 GB caches
    roomy = engine_limits(catalog, arch, shape, ["H200"], longest_prompt=9000)
    assert roomy.max_num_seqs == 32 and roomy.max_num_batched_tokens == 9000


@pytest.fixture(scope="module")
def ctx():
    return prepare(PlanRequest(model="llava-1.5-7b", rate=5, slo=SLO_, gpus="2xRTX4090,2xA100", requests_per_trial=40))


def test_prepare_runs_stage1_and_builds_both_search_spaces(ctx):
    assert 1 <= len(ctx.stage1.candidates) <= 4 and 3 <= ctx.stage1.feasible <= ctx.stage1.considered
    *kept, tight = ctx.stage1.candidates
    prices = [c.cost_per_hour for c in kept]
    assert prices == sorted(prices) and prices[-1] <= 1.2 * prices[0] + 1e-9  # ranked by price, 1.2x slack
    # the 4th: the cheapest layout under 100 % busy, cheaper than every survivor of the 85 % headroom
    assert tight.allocation.label() == "1xRTX4090:E+P,1xRTX4090:D" and tight.loads.score >= 0.85
    assert tight.cost_per_hour < prices[0]
    spaces = has_spaces(ctx)
    assert [s.b_max for s in spaces] == [c.b_max for c in ctx.stage1.candidates]
    assert len(baseline_spaces(ctx)) == ctx.stage1.feasible
    assert all(s.b_max == 5 for s in baseline_spaces(ctx))  # ceil(Lambda) for the unpruned baselines


def test_sim_backend_memoises_and_scores_goodput_per_dollar(ctx):
    cand = has_spaces(ctx)[0]
    config = TrialConfig(allocation=cand.allocation, knobs=cand.seed())
    runs = ctx.backend.runs
    first = ctx.backend.evaluate(config)
    assert ctx.backend.evaluate(config) is first and ctx.backend.runs == runs + 1
    assert first.objective == pytest.approx(first.goodput_rps * 3600 / first.cost_per_hour)
    assert first.cost_per_goodput == pytest.approx(1 / first.objective)
    assert first.requests == 40 and first.backend == "sim"


@pytest.mark.parametrize("kwargs,match", [
    ({"gpus": "2xB300"}, "unknown GPU tier 'B300'.*--catalog"),
    ({"budget_per_hour": 0.5, "tiers": ("L4",)}, "buys no complete allocation.*cheapest costs \\$1.62/h"),
    ({"gpus": "2xA100", "modality": "video"}, "no video workload"),
    ({"gpus": "1xRTX4090,1xA100", "rate": 500.0}, "no allocation keeps up with 500 req/s even at 100% busy"),
    ({"gpus": "2xA100", "model": "gpt-9"}, "unknown model 'gpt-9'"),
])
def test_bad_problems_raise_plan_errors_that_say_what_to_do(kwargs, match):
    fields = {"model": "llava-1.5-7b", "rate": 5.0, "slo": SLO_, **kwargs}
    with pytest.raises(PlanError, match=match):
        prepare(PlanRequest(**fields))


def test_request_needs_exactly_one_of_budget_and_inventory():
    with pytest.raises(ValueError, match="exactly one"):
        PlanRequest(model="llava-1.5-7b", rate=5, slo=SLO_)
    with pytest.raises(ValueError, match="exactly one"):
        PlanRequest(model="llava-1.5-7b", rate=5, slo=SLO_, gpus="2xA100", budget_per_hour=10)
