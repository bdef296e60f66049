"""PerfModel caches each tier's roofline constants and link bandwidths: same answers, one catalog lookup per name."""

from __future__ import annotations

import pytest

from coordinator.planner.arch import PRESETS
from coordinator.planner.catalog import Catalog, load_catalog
from coordinator.planner.perf import PerfModel, decode_cost, encode_cost, prefill_cost

LLAVA = PRESETS["llava-1.5-7b"]


def uncached_roofline(catalog: Catalog, pm: PerfModel, tier: str, flops: float, nbytes: float) -> float:
    """The formula without any cache, straight from the catalog (what perf.py computed before caching)."""
    t = catalog.tier(tier)
    ce = t.compute_efficiency or pm.roofline.compute_efficiency
    me = t.memory_efficiency or pm.roofline.memory_efficiency
    overhead = pm.roofline.launch_overhead_s if t.launch_overhead_s is None else t.launch_overhead_s
    return max(flops / (t.peak_flops * ce), nbytes / (t.bandwidth_bytes_s * me)) + overhead


@pytest.mark.parametrize("tier", ["A100", "a100-80gb", "RTX4090", "4090", "H200", "cpu"])
def test_cached_answers_equal_the_formula_for_every_name(tier):
    catalog = load_catalog()
    pm = PerfModel(catalog, LLAVA)
    for _ in range(2):  # the second round reads the cache
        assert pm.decode_step_s(tier, 8, 8000) == uncached_roofline(catalog, pm, tier, *decode_cost(LLAVA, 8, 8000))
        assert pm.prefill_s(tier, 700) == uncached_roofline(catalog, pm, tier, *prefill_cost(LLAVA, 700))
        assert pm.encode_s(tier, "image", 4, 576) == uncached_roofline(
            catalog, pm, tier, *encode_cost(LLAVA, "image", 4, 576))
    assert pm.roofline_s(catalog.tier(tier), 1e12, 1e9) == pm.roofline_s(tier, 1e12, 1e9)


def test_tier_names_resolve_once(monkeypatch):
    catalog = load_catalog()
    pm = PerfModel(catalog, LLAVA)
    calls = []
    real = Catalog.resolve
    monkeypatch.setattr(Catalog, "resolve", lambda self, name: calls.append(name) or real(self, name))
    for _ in range(100):
        pm.decode_step_s("A100", 4, 1000)
        pm.transfer_s(10_000, "RTX4090", "A100", same_host=True)
    assert len(calls) <= 4  # A100 once for the roofline; both tiers once for the link


def test_unknown_tiers_still_raise_every_time():
    pm = PerfModel(load_catalog(), LLAVA)
    for _ in range(2):
        with pytest.raises(KeyError, match="unknown GPU tier 'B300'"):
            pm.decode_step_s("B300", 1, 10)
    with pytest.raises(ValueError, match="batch must be >= 0"):
        pm.decode_step_s("A100", -1, 10)
