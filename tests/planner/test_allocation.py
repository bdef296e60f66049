"""Allocations: parsing, normalising, completeness, and enumeration within an inventory or a budget."""

from __future__ import annotations

import re

import pytest

from coordinator.planner.allocation import (
    Allocation, enumerate_budget, enumerate_inventory, parse_allocation, parse_inventory,
)
from coordinator.planner.catalog import load_catalog


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_parse_inventory_resolves_aliases_and_sums_repeats(catalog):
    assert parse_inventory("2xRTX4090,2xA100", catalog) == {"RTX4090": 2, "A100-80GB": 2}
    assert parse_inventory(" 1xL4, 2X l4 ,", catalog) == {"L4": 3}


@pytest.mark.parametrize("spec,match", [
    ("2RTX4090", "bad inventory entry '2RTX4090'"),
    ("0xL4", "bad inventory entry '0xL4'"),
    ("", "empty inventory"),
    ("2xL4:E", "without roles"),
    ("2xB300", "unknown GPU tier 'B300'"),
])
def test_parse_inventory_errors(catalog, spec, match):
    with pytest.raises((ValueError, KeyError), match=match):
        parse_inventory(spec, catalog)


def test_allocation_merges_groups_keeps_role_order_and_round_trips(catalog):
    a = Allocation.of((1, "A100-80GB", "P+D"), (1, "RTX4090", "E"), (1, "A100-80GB", "P+D"), (1, "RTX4090", "E"))
    assert a.label() == "2xRTX4090:E,2xA100-80GB:P+D"
    assert parse_allocation(a.label()) == a
    assert parse_allocation("2x4090:E,2xa100:P+D", catalog) == a
    assert (a.gpus, a.count("E", "E+P"), a.count("P+D")) == (4, 2, 2)
    assert a.gpus_by_tier() == {"RTX4090": 2, "A100-80GB": 2}
    assert a.cost_per_hour(catalog) == pytest.approx(2 * 0.50 + 2 * 3.67)


@pytest.mark.parametrize("spec,problem", [
    ("2xA100:P+D", "no encode GPU"),
    ("1xL4:E,1xA100:D", "D workers only take KV caches from P or E+P"),
    ("1xL4:E,1xA100:P", "no decode GPU"),
    ("1xL4:E+P,1xA100:P+D", "P and E+P send KV caches to a D worker, and there is none"),
    ("1xL4:E,1xL4:E", "no prefill GPU"),
])
def test_incomplete_allocations_say_what_is_missing(spec, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_allocation(spec)


def test_bad_role_is_named():
    with pytest.raises(ValueError, match="role 'X' .* not one of E, E\\+P, P, D, P\\+D"):
        parse_allocation("1xL4:X")


def test_inventory_enumeration_by_hand():
    # Two GPUs, each E, E+P, P, D, P+D or unused. The complete layouts are {E, P+D} and {E+P, D},
    # each with either GPU encoding: 4. One GPU alone is never complete.
    got = {a.label() for a in enumerate_inventory({"L4": 1, "A100-80GB": 1})}
    assert got == {"1xL4:E,1xA100-80GB:P+D", "1xA100-80GB:E,1xL4:P+D",
                   "1xL4:E+P,1xA100-80GB:D", "1xA100-80GB:E+P,1xL4:D"}


def test_inventory_enumeration_respects_can_host_and_leaves_gpus_unused():
    only_encode_on_l4 = lambda tier, role: tier != "L4" or role == "E"  # noqa: E731
    assert [a.label() for a in enumerate_inventory({"L4": 1, "A100-80GB": 1}, only_encode_on_l4)] == [
        "1xL4:E,1xA100-80GB:P+D"]
    layouts = enumerate_inventory({"RTX4090": 2, "A100-80GB": 2})
    assert len(layouts) == len(set(layouts))
    assert any(a.gpus == 2 for a in layouts) and any(a.gpus == 4 for a in layouts)
    assert parse_allocation("2xRTX4090:E,2xA100-80GB:P+D") in layouts


def test_inventory_too_large_is_refused():
    with pytest.raises(ValueError, match="role assignments, over max_allocations=100"):
        enumerate_inventory({"L4": 8}, max_allocations=100)


def test_budget_enumeration_by_hand(catalog):
    # L4 $0.81, A100 $3.67, at most 2 GPUs, $4.50/h: the two complete 2-GPU shapes ({E, P+D} and
    # {E+P, D}) on L4+L4 ($1.62) and on L4+A100 either way round ($4.48); A100+A100 ($7.34) is over.
    got = {a.label() for a in enumerate_budget(catalog, 4.5, tiers=["L4", "A100"], max_gpus=2)}
    assert got == {"1xL4:E,1xL4:P+D", "1xL4:E+P,1xL4:D",
                   "1xL4:E,1xA100-80GB:P+D", "1xL4:E+P,1xA100-80GB:D",
                   "1xA100-80GB:E,1xL4:P+D", "1xA100-80GB:E+P,1xL4:D"}
    assert enumerate_budget(catalog, 1.0, tiers=["L4", "A100"], max_gpus=2) == []


def test_budget_enumeration_stays_within_budget_and_gpu_cap(catalog):
    layouts = enumerate_budget(catalog, 10.0, tiers=["RTX4090", "A100-80GB"], max_gpus=4)
    assert layouts and all(a.cost_per_hour(catalog) <= 10.0 + 1e-9 and a.gpus <= 4 for a in layouts)
    assert parse_allocation("2xRTX4090:E,2xA100-80GB:P+D") in layouts   # HeteroServe's layout, $8.34/h
    assert parse_allocation("1xA100-80GB:E,3xA100-80GB:P+D") not in layouts  # $14.68/h
    assert all(len({g.tier for g in a.groups if g.role in ("E", "E+P")}) == 1 for a in layouts)
    with pytest.raises(ValueError, match="budget_per_hour must be > 0"):
        enumerate_budget(catalog, 0)


def test_budget_enumeration_skips_the_cpu_tier_unless_named(catalog):
    assert all("cpu" not in a.gpus_by_tier() for a in enumerate_budget(catalog, 2.0, max_gpus=2))
    assert enumerate_budget(catalog, 0.01, tiers=["cpu"], max_gpus=2)
