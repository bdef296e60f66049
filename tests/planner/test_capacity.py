"""Capacities C_E, C_P, C_D per tier: HAS's stress procedures run against a table of service times."""

from __future__ import annotations

import math

import pytest

from coordinator.planner.arch import PRESETS
from coordinator.planner.capacity import (
    CapacityConfig, RequestShape, capacities, fits, host_check, kv_bytes_per_request, tier_capacity,
)
from coordinator.planner.catalog import load_catalog
from coordinator.planner.perf import PerfModel

LLAVA = PRESETS["llava-1.5-7b"]
SHAPE = RequestShape(modality="image", media_tokens=576, text_tokens=424, output_tokens=101)


class TableTimes:
    """Simple closed forms, so every capacity can be worked out by hand."""

    def encode_s(self, tier, modality, batch, tokens_per_item):
        return 0.01 * max(batch, 4)          # flat up to B=4, then linear: saturates at B=4

    def prefill_s(self, tier, tokens):
        return 0.05 + 0.001 * tokens

    def decode_step_s(self, tier, batch, context_tokens):
        return 0.02 + 1e-6 * context_tokens

    def transfer_s(self, nbytes, src_tier, dst_tier, same_host):
        return 0.0


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_encode_doubles_until_throughput_saturates(catalog):
    cap = tier_capacity(TableTimes(), catalog, LLAVA, "L4", SHAPE)
    # B=1: 25/s, 2: 50/s, 4: 100/s, 8: 100/s (no gain) -> stop; C_E = 100 at B = 4.
    assert (cap.encode, cap.encode_batch) == (pytest.approx(100.0), 4)


def test_prefill_batches_whole_prompts_within_the_token_budget(catalog):
    cap = tier_capacity(TableTimes(), catalog, LLAVA, "L4", SHAPE)
    # 1000-token prompts, 8192-token budget: batches 1, 2, 4, 8; the best is 8 / (0.05 + 8.0).
    assert cap.prefill == pytest.approx(8 / 8.05)
    assert cap.local_prefill == cap.prefill


def test_decode_batch_is_capped_by_kv_memory(catalog):
    cap = tier_capacity(TableTimes(), catalog, LLAVA, "L4", SHAPE)
    free = 24e9 * 0.9 - LLAVA.llm_weight_bytes()
    batch = int(free // kv_bytes_per_request(LLAVA, SHAPE))
    assert batch == 14 and cap.decode_batch == 14
    step = 0.02 + 1e-6 * round(14 * (1000 + 101 / 2))
    assert cap.decode == pytest.approx(14 / (100 * step))   # 100 decode steps per request


def test_decode_batch_is_capped_by_the_tpot_slo(catalog):
    cap = tier_capacity(TableTimes(), catalog, LLAVA, "L4", SHAPE, CapacityConfig(tpot_slo_s=0.03))
    # Steps: b=8 -> 0.0284 s (within), b=14 -> 0.0347 s (over).
    assert cap.decode_batch == 8
    assert cap.decode == pytest.approx(8 / (100 * (0.02 + 1e-6 * round(8 * 1050.5))))


def test_one_output_token_needs_no_decode(catalog):
    shape = SHAPE.model_copy(update={"output_tokens": 1})
    assert math.isinf(tier_capacity(TableTimes(), catalog, LLAVA, "L4", shape).decode)


def test_fits_checks_weights_plus_one_request(catalog):
    ultravox = PRESETS["ultravox"]
    shape = RequestShape(modality="audio", media_tokens=188, text_tokens=50, output_tokens=100)
    assert fits(catalog, ultravox, shape, "L4", "E")
    assert not fits(catalog, ultravox, shape, "L4", "P")          # 54 GB of weights, 21.6 GB usable
    assert fits(catalog, ultravox, shape, "A100", "D")
    assert fits(catalog, LLAVA, SHAPE, "RTX4090", "E+P")           # 0.65 + 13.5 + 0.6 GB <= 21.6 GB
    assert not fits(catalog, LLAVA, SHAPE, "RTX4090", "E+P", CapacityConfig(memory_utilisation=0.5))
    can_host = host_check(catalog, ultravox, shape)
    assert can_host("H200", "P+D") and not can_host("RTX4090", "P+D")


def test_roles_that_do_not_fit_get_zero_capacity(catalog):
    ultravox = PRESETS["ultravox"]
    shape = RequestShape(modality="audio", media_tokens=188, text_tokens=50, output_tokens=100)
    cap = tier_capacity(PerfModel(catalog, ultravox), catalog, ultravox, "l4", shape)
    assert cap.tier == "L4" and cap.encode > 0
    assert cap.prefill == cap.decode == cap.local_prefill == 0.0


def test_roofline_capacities_order_the_tiers_sensibly(catalog):
    caps = capacities(PerfModel(catalog, LLAVA), catalog, LLAVA, ["RTX4090", "a100", "H100"], SHAPE)
    assert list(caps) == ["RTX4090", "A100-80GB", "H100"]
    assert caps["H100"].prefill > caps["A100-80GB"].prefill > caps["RTX4090"].prefill
    assert caps["A100-80GB"].decode > 3 * caps["RTX4090"].decode      # HBM and room for a big batch
    # Encoding is cheap next to the LLM: one 4090 encodes far faster than one A100 decodes.
    assert caps["RTX4090"].encode > 10 * caps["A100-80GB"].decode
