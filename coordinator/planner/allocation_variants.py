"""The plan space with deployment variants: each allocation's LLM workers in every dtype and TP degree allowed.

An allocation from the enumerators (allocation.py) says which GPUs play which role; this expands it into
the variants its LLM groups may run (variants.py): one weight dtype for the whole allocation (one
checkpoint is served), and per group a tensor-parallel degree that divides its GPU count and fits in
memory. E+P groups stay at TP 1 (the local worker shares one encode GPU). The enumerators are first
run with `hosts_some_variant`, so a model that fits no GPU in bf16 (a 34B model on 24 GB cards) still
gets its layouts, which the expansion then keeps only in the variants that fit.
"""

from __future__ import annotations

import itertools

from coordinator.planner.allocation import Allocation, CanHost, GpuGroup
from coordinator.planner.variants import Variant, VariantSpace, service_key


def hosts_some_variant(can_host: CanHost, space: VariantSpace) -> CanHost:
    """`can_host` widened to "some variant of the space fits", for the role enumeration before expansion."""
    def check(tier: str, role) -> bool:
        if role == "E":
            return can_host(tier, role)
        tps = (1,) if role == "E+P" else space.tp
        return any(can_host(service_key(tier, Variant(dtype=d, tp=t)), role) for d in space.dtypes for t in tps)
    return check


def _options(group: GpuGroup, dtype: str, space: VariantSpace, can_host: CanHost) -> list[GpuGroup]:
    if group.role == "E":
        return [group]
    tps = (1,) if group.role == "E+P" else [t for t in space.tp if group.count % t == 0]
    variants = [Variant(dtype=dtype, tp=t) for t in tps]
    return [GpuGroup(tier=group.tier, role=group.role, count=group.count, variant=v) for v in variants
            if can_host(service_key(group.tier, v), group.role)]


def with_variants(allocation: Allocation, space: VariantSpace, can_host: CanHost) -> list[Allocation]:
    """`allocation` in every variant assignment of `space` that fits (at most space.max_per_allocation,
    smallest TP degrees first); [] when none fits."""
    out: list[Allocation] = []
    for dtype in space.dtypes:
        choices = [_options(g, dtype, space, can_host) for g in allocation.groups]
        for combo in itertools.islice(itertools.product(*choices), space.max_per_allocation):
            out.append(Allocation(groups=combo))
    return list(dict.fromkeys(out))[:space.max_per_allocation]


def expand(allocations: list[Allocation], space: VariantSpace, can_host: CanHost) -> list[Allocation]:
    """Every allocation of `allocations` in each of its fitting variants, without repeats."""
    return list(dict.fromkeys(a for base in allocations for a in with_variants(base, space, can_host)))
