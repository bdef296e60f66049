"""GPU catalog: the built-in tiers, aliases, merging user files, and errors that name file, tier and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.planner.catalog import CatalogError, load_catalog

SEEDED = ["RTX4090", "L4", "L40S", "A10G", "A100-80GB", "H100", "H200"]


def write(tmp_path: Path, text: str, name: str = "user.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_has_every_seeded_tier_with_a_dated_sourced_price():
    catalog = load_catalog()
    assert catalog.names("gpu") == SEEDED
    assert catalog.names("cpu") == ["cpu"]
    for name in SEEDED:
        tier = catalog.tier(name)
        assert tier.price_per_hour > 0 and tier.price_source and tier.price_date == "2026-11"
        assert tier.sms and tier.tpcs == tier.sms // 2 and tier.pcie_gen in (4, 5)


def test_builtin_numbers_match_the_design_table():
    c = load_catalog()
    h100, l4, a100, r4090 = c.tier("H100"), c.tier("L4"), c.tier("A100-80GB"), c.tier("RTX4090")
    assert (h100.peak_bf16_tflops, h100.bandwidth_gbs, h100.memory_gb, h100.sms) == (989, 3350, 80, 132)
    assert (l4.peak_bf16_tflops, l4.bandwidth_gbs, l4.price_per_hour) == (121, 300, 0.81)
    assert a100.nvlink_gbs == 300 and r4090.nvlink_gbs is None
    assert c.tier("H200").memory_gb == 141 and c.tier("L40S").sms == 142
    # HeteroServe's purchase prices: 2x4090 + 2xA100 = $38k, 4xA100 = $64k.
    assert 2 * r4090.purchase_price_usd + 2 * a100.purchase_price_usd == 38_000
    assert 4 * a100.purchase_price_usd == 64_000
    assert "price_per_hour" in r4090.estimates and "peak_bf16_tflops" in c.tier("A10G").estimates


def test_host_link_is_pcie_by_generation_and_memory_for_cpu():
    c = load_catalog()
    assert c.tier("A100").host_link_bytes_s == pytest.approx(31.5e9)
    assert c.tier("H100").host_link_bytes_s == pytest.approx(63e9)
    assert c.tier("cpu").host_link_bytes_s == c.tier("cpu").bandwidth_bytes_s
    assert c.tier("cpu").price_per_hour == 0.0 and c.tier("cpu").tpcs is None


@pytest.mark.parametrize("name,canonical", [("a100", "A100-80GB"), ("RTX-4090", "RTX4090"),
                                             (" h100-sxm ", "H100"), ("4090", "RTX4090"), ("CPU", "cpu")])
def test_aliases_resolve_case_insensitively(name, canonical):
    assert load_catalog().resolve(name) == canonical


def test_unknown_tier_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown GPU tier 'B200'.*RTX4090"):
        load_catalog().tier("B200")


def test_user_price_override_keeps_other_fields_and_records_its_source(tmp_path):
    user = write(tmp_path, "tiers:\n  a100:\n    price_per_hour: 1.29\n")
    c = load_catalog(user)
    a100 = c.tier("A100-80GB")
    assert a100.price_per_hour == 1.29 and a100.bandwidth_gbs == 2039
    assert str(user) in a100.price_source and a100.price_date is None
    assert c.files == (str(Path(c.files[0])), str(user))


def test_user_override_with_its_own_source_and_date(tmp_path):
    user = write(tmp_path, "tiers:\n  cpu:\n    price_per_hour: 0.2\n    price_source: our colo\n"
                           "    price_date: 2026-10-05\n")
    cpu = load_catalog(user).tier("cpu")
    assert (cpu.price_per_hour, cpu.price_source, cpu.price_date) == (0.2, "our colo", "2026-10-05")


def test_user_file_adds_a_tier_and_later_files_win(tmp_path):
    first = write(tmp_path, """
tiers:
  B200:
    aliases: [b200-sxm]
    peak_bf16_tflops: 2250
    memory_gb: 180
    bandwidth_gbs: 8000
    pcie_gen: 5
    sms: 148
    price_per_hour: 9.0
    price_source: a quote
    price_date: 2026-11
""", "a.yaml")
    second = write(tmp_path, "tiers:\n  B200-SXM:\n    price_per_hour: 8.0\n", "b.yaml")
    c = load_catalog(first, second)
    assert c.tier("b200").price_per_hour == 8.0 and c.tier("b200").tpcs == 74
    assert "b.yaml" in c.tier("B200").price_source
    assert c.names("gpu")[-1] == "B200"


def test_new_tier_missing_fields_names_them_and_the_file(tmp_path):
    user = write(tmp_path, "tiers:\n  MI300X:\n    memory_gb: 192\n")
    with pytest.raises(CatalogError) as err:
        load_catalog(user)
    msg = str(err.value)
    assert str(user) in msg and "'MI300X'" in msg
    for field in ("peak_bf16_tflops", "bandwidth_gbs", "price_per_hour", "price_source"):
        assert f"field {field!r}" in msg
    assert "Fix these fields under tiers.MI300X" in msg


def test_bad_value_prints_the_value(tmp_path):
    user = write(tmp_path, "tiers:\n  L4:\n    bandwidth_gbs: -300\n")
    with pytest.raises(CatalogError, match=r"tier 'L4'.*\n.*field 'bandwidth_gbs'.*greater than 0.*got -300"):
        load_catalog(user)


def test_misspelt_field_is_rejected(tmp_path):
    user = write(tmp_path, "tiers:\n  L4:\n    price_per_hr: 0.5\n")
    with pytest.raises(CatalogError, match="field 'price_per_hr': Extra inputs are not permitted"):
        load_catalog(user)


def test_gpu_tier_needs_sms_and_pcie(tmp_path):
    user = write(tmp_path, "tiers:\n  X:\n    peak_bf16_tflops: 1\n    memory_gb: 1\n    bandwidth_gbs: 1\n"
                           "    price_per_hour: 1\n    price_source: s\n")
    with pytest.raises(CatalogError, match="needs sms and pcie_gen"):
        load_catalog(user)


def test_estimates_must_name_real_fields(tmp_path):
    user = write(tmp_path, "tiers:\n  L4:\n    estimates: [speed]\n")
    with pytest.raises(CatalogError, match=r"unknown fields \['speed'\]"):
        load_catalog(user)


def test_alias_clash_between_tiers_is_reported(tmp_path):
    user = write(tmp_path, "tiers:\n  L4:\n    aliases: [a100]\n")
    with pytest.raises(CatalogError, match="is used by tiers 'L4' and 'A100-80GB'; rename one"):
        load_catalog(user)


@pytest.mark.parametrize("text,match", [
    ("tiers: [1, 2]", "must map each tier name"),
    ("tier:\n  L4: {}\n", r"expected a mapping with keys 'version' and 'tiers', got \['tier'\]"),
    ("version: 2\ntiers: {}\n", "version 2 is not supported"),
    ("tiers:\n  L4: [unclosed\n", "not valid YAML"),
])
def test_malformed_files_say_what_is_wrong(tmp_path, text, match):
    with pytest.raises(CatalogError, match=match):
        load_catalog(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog(tmp_path / "nope.yaml")
