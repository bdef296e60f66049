"""Performance model: measured profiles (piecewise-linear), the roofline estimate, transfers, architectures."""

from __future__ import annotations

import pytest

from coordinator.planner.arch import PRESETS, get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.perf import NetworkConfig, PerfModel, RooflineConfig, decode_cost, prefill_cost
from coordinator.planner.profile import DecodePoint, Profile, dominated_decode, interpolate, load_profiles

LLAVA = PRESETS["llava-1.5-7b"]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def make_profile(**overrides) -> Profile:
    fields = dict(
        tier="rtx4090", model="llava-1.5-7b", measured_at="2026-11-02", source="test",
        encode={"image": {"tokens_per_item": 576, "points": [{"batch": 1, "seconds": 0.010},
                                                            {"batch": 4, "seconds": 0.025}]}},
        prefill=[{"tokens": 1000, "seconds": 0.1}, {"tokens": 2000, "seconds": 0.18}],
        decode=[{"batch": 1, "context_tokens": 1000, "seconds": 0.020},
                {"batch": 1, "context_tokens": 3000, "seconds": 0.024},
                {"batch": 8, "context_tokens": 8000, "seconds": 0.030},
                {"batch": 8, "context_tokens": 24000, "seconds": 0.046}],
    )
    fields.update(overrides)
    return Profile.model_validate(fields)


# --- interpolation ---------------------------------------------------------------------------------

def test_interpolate_inside_and_beyond_both_ends():
    pts = [(1, 10.0), (3, 20.0), (7, 24.0)]
    assert interpolate(pts, 2) == pytest.approx(15.0)
    assert interpolate(pts, 5) == pytest.approx(22.0)
    assert interpolate(pts, 9) == pytest.approx(26.0)   # last segment's slope 1 per unit
    assert interpolate(pts, 0) == pytest.approx(5.0)    # first segment's slope 5 per unit


def test_interpolate_never_negative_single_point_constant_duplicates_averaged():
    assert interpolate([(10, 1.0), (20, 3.0)], 0) == 0.0   # would be -1
    assert interpolate([(4, 2.5)], 100) == 2.5
    assert interpolate([(1, 1.0), (1, 3.0), (2, 4.0)], 1.5) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="at least one"):
        interpolate([], 1)


# --- measured profiles -----------------------------------------------------------------------------

def test_profile_reads_encode_in_total_tokens():
    p = make_profile()
    assert p.encode_s("image", 2, 576) == pytest.approx(0.015)
    # Two items of 1152 tokens hold as many tokens as a batch of 4 of the measured size.
    assert p.encode_s("image", 2, 1152) == pytest.approx(0.025)
    assert p.encode_s("audio", 1, 100) is None


def test_profile_decode_is_linear_in_context_then_in_batch():
    p = make_profile()
    assert p.decode_step_s(1, 2000) == pytest.approx(0.022)
    assert p.decode_step_s(8, 16000) == pytest.approx(0.038)
    # batch 4.5 is halfway between the rows; each row read at context 8000.
    row1, row8 = 0.020 + 0.004 * 7000 / 2000, 0.030
    assert p.decode_step_s(4, 8000) == pytest.approx(row1 + (row8 - row1) * 3 / 7)
    assert p.prefill_s(4000) == pytest.approx(0.34)


def test_profile_decode_step_no_slower_than_a_step_with_more_sequences_and_kv():
    # Median-pooled live profile (sim_fidelity_layouts epd): batch 1 x 48 took 6.9 ms, batch 2 x 96 3.3 ms.
    pts = [DecodePoint(batch=1, context_tokens=48, seconds=0.0069), DecodePoint(batch=1, context_tokens=528, seconds=0.0040),
           DecodePoint(batch=2, context_tokens=96, seconds=0.0033), DecodePoint(batch=2, context_tokens=1056, seconds=0.0061)]
    p = Profile(tier="cpu", model="m", measured_at="2026-12-02", decode=tuple(pts))
    assert [q.seconds for q in dominated_decode(pts)] == [0.0033, 0.0040, 0.0033, 0.0061]
    assert p.decode_step_s(1, 48) == pytest.approx(0.0033)
    assert p.decode_step_s(1, 288) == pytest.approx(0.00365)  # halfway along the bounded row
    assert p.decode_step_s(2, 1056) == pytest.approx(0.0061)  # points nothing dominates are kept
    # A point is bounded only by one with at least its sequences AND its KV: fewer KV does not bound it.
    q = [DecodePoint(batch=1, context_tokens=528, seconds=0.005), DecodePoint(batch=2, context_tokens=96, seconds=0.003)]
    assert [x.seconds for x in dominated_decode(q)] == [0.005, 0.003]


def test_profile_round_trips_through_json(tmp_path):
    p = make_profile()
    path = p.save(tmp_path / "profiles" / "rtx4090.json")
    assert Profile.load(path) == p
    assert load_profiles([tmp_path / "profiles"]) == {"rtx4090": p}


def test_profile_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"tier": "L4", "model": "m", "measured_at": "2026", "prefill": [{"tokens": 0, "seconds": 1}]}')
    with pytest.raises(ValueError, match=r"bad.json is invalid: prefill.0.tokens: .*greater than or equal to 1"):
        Profile.load(bad)
    with pytest.raises(ValueError, match="no measured points"):
        Profile(tier="L4", model="m", measured_at="2026")
    with pytest.raises(ValueError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")


def test_perf_model_prefers_measurements_and_falls_back_per_stage(catalog):
    pm = PerfModel(catalog, LLAVA, [make_profile(decode=())])
    assert pm.encode_s("RTX4090", "image", 4, 576) == pytest.approx(0.025)
    assert pm.prefill_s("rtx-4090", 1500) == pytest.approx(0.14)
    assert pm.source("RTX4090", "prefill") == "measured"
    assert pm.source("RTX4090", "decode") == "roofline"
    assert pm.source("L4", "encode") == "roofline"
    assert pm.decode_step_s("RTX4090", 1, 1000) == pytest.approx(PerfModel(catalog, LLAVA).decode_step_s(
        "RTX4090", 1, 1000))


def test_profile_of_another_model_is_refused(catalog):
    with pytest.raises(ValueError, match="measured on model 'other'"):
        PerfModel(catalog, LLAVA, {"x": make_profile(model="other")})


# --- roofline --------------------------------------------------------------------------------------

def test_h100_is_faster_than_l4_at_every_stage(catalog):
    pm = PerfModel(catalog, LLAVA)
    assert pm.encode_s("H100", "image", 8, 576) < pm.encode_s("L4", "image", 8, 576)
    assert pm.prefill_s("H100", 2000) < pm.prefill_s("L4", 2000) / 3
    assert pm.decode_step_s("H100", 16, 16000) < pm.decode_step_s("L4", 16, 16000) / 5


def test_decode_is_memory_bound_and_prefill_compute_bound(catalog):
    cfg = RooflineConfig(compute_efficiency=0.5, memory_efficiency=0.8, launch_overhead_s=0.001)
    pm = PerfModel(catalog, LLAVA, roofline=cfg)
    a100 = catalog.tier("A100")
    flops, nbytes = decode_cost(LLAVA, 8, 8000)
    assert nbytes / (a100.bandwidth_bytes_s * 0.8) > 10 * flops / (a100.peak_flops * 0.5)
    assert pm.decode_step_s("A100", 8, 8000) == pytest.approx(nbytes / (2039e9 * 0.8) + 0.001)
    # Bytes, not FLOPs, set the step: eight sequences cost as much as one holding the same KV cache,
    # and the KV cache read grows the step (0.5 MB per token of LLaVA-7B's MHA cache).
    assert pm.decode_step_s("A100", 8, 1000) == pytest.approx(pm.decode_step_s("A100", 1, 1000), rel=0.01)
    assert pm.decode_step_s("A100", 8, 8000) > 1.2 * pm.decode_step_s("A100", 8, 1000)
    flops, nbytes = prefill_cost(LLAVA, 2000)
    assert pm.prefill_s("A100", 2000) == pytest.approx(flops / (312e12 * 0.5) + 0.001)
    # 7B weights: 13.5 GB; a decode step on an A100 streams them in ~8 ms.
    assert 0.007 < pm.decode_step_s("A100", 1, 100) < 0.011


def test_encoder_is_compute_bound_and_grows_with_batch(catalog):
    pm = PerfModel(catalog, LLAVA)
    one, eight = pm.encode_s("RTX4090", "image", 1, 576), pm.encode_s("RTX4090", "image", 8, 576)
    assert 5 < eight / one < 8.5


def test_tier_overrides_beat_roofline_defaults(catalog):
    # cpu sets its own launch overhead (5 ms) in the catalog; other tiers take the config's.
    pm = PerfModel(catalog, get_arch("tiny-llava"), roofline=RooflineConfig(launch_overhead_s=0.0))
    assert pm.decode_step_s("cpu", 1, 1) >= 0.005
    assert pm.decode_step_s("RTX4090", 1, 1) < 1e-4


def test_zero_work_takes_no_time_and_negative_work_is_an_error(catalog):
    pm = PerfModel(catalog, LLAVA)
    assert pm.prefill_s("L4", 0) == pm.decode_step_s("L4", 0, 0) == pm.encode_s("L4", "image", 0, 576) == 0.0
    assert pm.transfer_s(0, "L4", "L4", False) == 0.0
    with pytest.raises(ValueError, match="tokens must be >= 0, got tokens=-1"):
        pm.prefill_s("L4", -1)
    with pytest.raises(ValueError, match="no encoder for 'audio'"):
        pm.encode_s("L4", "audio", 1, 100)


# --- transfers -------------------------------------------------------------------------------------

def test_transfer_over_network_pcie_and_nvlink(catalog):
    pm = PerfModel(catalog, LLAVA, network=NetworkConfig(nic_gbps=100, network_latency_s=1e-4,
                                                         host_latency_s=1e-5))
    emb = LLAVA.embedding_bytes_per_item("image")
    assert pm.transfer_s(emb, "RTX4090", "A100", same_host=False) == pytest.approx(emb / 12.5e9 + 1e-4)
    assert pm.transfer_s(emb, "RTX4090", "H100", same_host=True) == pytest.approx(emb / 31.5e9 + 1e-5)
    assert pm.transfer_s(emb, "H100", "H100", same_host=True) == pytest.approx(emb / 450e9 + 1e-5)
    slow_nic = PerfModel(catalog, LLAVA, network=NetworkConfig(nic_gbps=10, use_nvlink=False))
    assert slow_nic.link_bytes_s("H100", "H100", same_host=True) == 63e9
    assert slow_nic.link_bytes_s("H100", "H100", same_host=False) == 1.25e9


# --- architectures ---------------------------------------------------------------------------------

def test_llava_sizes_match_heteroserve():
    # 576 tokens x 4096 x 2 bytes = 4.7 MB (HeteroServe's "~4.5 MB" embedding).
    assert LLAVA.embedding_bytes_per_item("image") == 576 * 4096 * 2
    assert LLAVA.kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2
    # The KV cache of one image's prompt is O(L) times its embedding: 2 * 32 layers here.
    assert LLAVA.kv_bytes_per_token() * 576 / LLAVA.embedding_bytes_per_item("image") == 64
    assert 13e9 < LLAVA.llm_weight_bytes() < 14e9


def test_presets_cover_the_seeds_models():
    assert {"llava-1.5-7b", "llava-v1.6-34b", "qwen2.5-vl-7b", "qwen2.5-vl-32b", "ultravox"} <= set(PRESETS)
    assert get_arch("ultravox").modalities() == ["audio"]
    assert get_arch("qwen2.5-vl-32b").tokens_per_item("video") == 128
    with pytest.raises(ValueError, match="does not say how many tokens one video"):
        LLAVA.tokens_per_item("video")
    with pytest.raises(KeyError, match="unknown model 'gpt-9'"):
        get_arch("gpt-9")


def test_tiny_llava_is_read_from_the_checkpoint_config():
    tiny = get_arch("tiny-llava")
    assert (tiny.name, tiny.dtype_bytes, tiny.tokens_per_image) == ("tiny-llava", 4, 196)
    assert (tiny.llm.layers, tiny.llm.hidden, tiny.llm.kv_heads, tiny.llm.head_dim) == (4, 128, 2, 32)
    # Against the safetensors' tensor sizes (LLM 852,096; vision tower + projector 153,856): biases
    # and norms are left out, under 2%.
    assert tiny.llm.params == pytest.approx(852_096, rel=0.02)
    assert tiny.vision.params == pytest.approx(153_856, rel=0.02)
    assert tiny.kv_bytes_per_token() == 2 * 4 * 2 * 32 * 4
