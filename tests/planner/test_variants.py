"""Deployment variants (dtype, tensor parallel): memory fits against hand-computed figures, speed factors,
the search space they open, and plans that say "simulated only"."""

from __future__ import annotations

import pytest

from coordinator.planner.allocation import Allocation, parse_allocation, worker_price
from coordinator.planner.allocation_variants import expand, with_variants
from coordinator.planner.arch import get_arch
from coordinator.planner.capacity import RequestShape, fits, host_check
from coordinator.planner.catalog import load_catalog
from coordinator.planner.goodput import SLO
from coordinator.planner.perf import PerfModel
from coordinator.planner.planfile import load_plan
from coordinator.planner.planning import PlanRequest, make_plan, prepare, search
from coordinator.planner.variants import Variant, VariantSpace, service_key, split_key

CATALOG = load_catalog()
YI34 = get_arch("llava-v1.6-34b")
# One 336 px request of 576 image tokens + 64 text + 128 output = 768 tokens of KV.
SHAPE = RequestShape(modality="image", media_tokens=576, text_tokens=64, output_tokens=128)


def test_hand_computed_memory_fits_of_a_34b_model():
    """Usable memory = 0.9 x 24 GB = 21.6 GB per RTX 4090. Yi-34B: 34.4e9 weights; KV 2 x 60 layers x 8 kv heads
    x 128 x 2 B = 245,760 B/token, x 768 tokens = 0.189 GB per request.
      bf16 TP1: 68.8 GB          > 21.6  no      int8 TP1: 34.4 GB              > 21.6  no
      bf16 TP2: 34.4 GB/GPU      > 21.6  no      int8 TP2: 17.2 + 0.094 GB/GPU <= 21.6  yes
      bf16 TP4: 17.2 + 0.047     <= 21.6 yes     A100-80GB (72 GB) bf16 TP1: 68.8 + 0.189 <= 72  yes
    """
    assert YI34.kv_bytes_per_token() == 245_760
    expect = {"RTX4090": False, "RTX4090[int8/tp1]": False, "RTX4090[bf16/tp2]": False,
              "RTX4090[int8/tp2]": True, "RTX4090[fp8/tp2]": True, "RTX4090[bf16/tp4]": True,
              "A100-80GB": True, "L40S[int8/tp1]": True}  # L40S: 0.9 x 48 = 43.2 >= 34.4 + 0.19
    for key, ok in expect.items():
        assert fits(CATALOG, YI34, SHAPE, key, "P+D") is ok, key
    # E+P holds the encoder too and runs at TP 1: llava-1.5-7b bf16 = 13.5 GB + 0.6 GB CLIP fits one 4090
    assert fits(CATALOG, get_arch("llava-1.5-7b"), SHAPE, "RTX4090", "E+P")
    assert not fits(CATALOG, YI34, SHAPE, "RTX4090[int8/tp2]", "E+P")


def test_service_keys_labels_and_prices_round_trip():
    assert split_key("A100-80GB[int8/tp2]") == ("A100-80GB", Variant(dtype="int8", tp=2))
    assert service_key("A100-80GB", Variant()) == "A100-80GB"  # every plan before variants reads the same
    alloc = parse_allocation("1xRTX4090:E,4xA100[fp8/tp2]:P+D", CATALOG)
    assert alloc.label() == "1xRTX4090:E,4xA100-80GB[fp8/tp2]:P+D"
    assert alloc.workers("P+D") == [("A100-80GB[fp8/tp2]", 2)] and alloc.gpus == 5
    assert worker_price(CATALOG, "A100-80GB[fp8/tp2]") == pytest.approx(2 * 3.67)
    with pytest.raises(ValueError, match="do not make whole tp-2 workers"):
        parse_allocation("1xRTX4090:E,3xA100[bf16/tp2]:P+D", CATALOG)
    with pytest.raises(ValueError, match="runs on that GPU alone"):
        parse_allocation("2xA100[bf16/tp2]:E+P,1xA100:D", CATALOG)
    with pytest.raises(ValueError, match="cannot read worker"):
        split_key("A100[int4/tp2]")


def test_speed_factors_follow_the_roofline_sources():
    perf = PerfModel(CATALOG, get_arch("llava-1.5-7b"))
    # decode is memory-bound: int8 weight-only halves the weight bytes, faster on A100 without FP8 cores
    assert perf.decode_step_s("A100-80GB[int8/tp1]", 8, 8 * 700) < 0.75 * perf.decode_step_s("A100-80GB", 8, 8 * 700)
    # prefill is compute-bound: weight-only int8 / fp8 on Ampere keep the BF16 FLOP rate; fp8 on Ada doubles it
    assert perf.prefill_s("A100-80GB[int8/tp1]", 2000) == pytest.approx(perf.prefill_s("A100-80GB", 2000), rel=0.02)
    assert perf.prefill_s("A100-80GB[fp8/tp1]", 2000) == pytest.approx(perf.prefill_s("A100-80GB", 2000), rel=0.02)
    assert perf.prefill_s("RTX4090[fp8/tp1]", 2000) < 0.6 * perf.prefill_s("RTX4090", 2000)
    # TP 2 halves each GPU's work but pays all-reduces: cheaper over NVLink (A100) than over PCIe (4090)
    nvlink = perf.prefill_s("A100-80GB[bf16/tp2]", 2000) / perf.prefill_s("A100-80GB", 2000)
    pcie = perf.prefill_s("RTX4090[bf16/tp2]", 2000) / perf.prefill_s("RTX4090", 2000)
    assert 0.5 < nvlink < pcie < 1.0


def test_expansion_keeps_only_fitting_variants():
    can_host = host_check(CATALOG, YI34, SHAPE)
    base = Allocation.of((1, "RTX4090", "E"), (2, "RTX4090", "P+D"))
    found = {a.label() for a in with_variants(base, VariantSpace(dtypes=("bf16", "int8")), can_host)}
    assert found == {"1xRTX4090:E,2xRTX4090[int8/tp2]:P+D"}
    assert with_variants(base, VariantSpace(), can_host) == []  # bf16 fits no 4090 pair
    small = host_check(CATALOG, get_arch("llava-1.5-7b"), SHAPE)
    labels = {a.label() for a in expand([Allocation.of((1, "RTX4090", "E"), (2, "A100", "P+D"))], VariantSpace(), small)}
    assert labels == {"1xRTX4090:E,2xA100:P+D", "1xRTX4090:E,2xA100[bf16/tp2]:P+D"}


def test_a_plan_needing_a_variant_is_marked_simulated_only(tmp_path):
    req = PlanRequest(model="llava-v1.6-34b", rate=0.3, slo=SLO(ttft_s=20, tpot_s=0.2), gpus="3xRTX4090",
                      variants=VariantSpace(dtypes=("bf16", "int8")), requests_per_trial=20, prediction_requests=30)
    ctx = prepare(req)
    plan = make_plan(ctx, search(ctx, "has", trials=3))
    assert [n.dtype for n in plan.nodes if n.role == "P+D"] == ["int8", "int8"]
    assert [n.worker_gpu for n in plan.nodes if n.role == "P+D"] == [1, 1]
    assert plan.simulated_only and "tensor parallel 2" in plan.simulated_only[0]
    loaded = load_plan(plan.save(tmp_path / "p.yaml"))
    assert [n.tier for n in loaded.deployment().nodes] == ["RTX4090", "RTX4090[int8/tp2]"]  # one worker, two GPUs
    assert loaded.allocation() == ctx.stage1.candidates[0].allocation
    assert loaded.cost_per_hour() == pytest.approx(3 * 0.5)


def test_a_bf16_plan_runs_live():
    req = PlanRequest(model="llava-1.5-7b", rate=1, slo=SLO(ttft_s=2, tpot_s=0.1), gpus="1xRTX4090,1xA100",
                      requests_per_trial=20, prediction_requests=30)
    ctx = prepare(req)
    assert make_plan(ctx, search(ctx, "has", trials=2)).simulated_only == []
