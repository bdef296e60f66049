"""Allocations: which GPUs of which tiers play which role, and the enumeration the planner searches.

Roles, and the runtime workers they become:
  E    an encode worker alone on the GPU                     (encode)
  E+P  an encode worker plus a co-located local prefill one  (encode + prefill, EAServe's offload target)
  P    a remote prefill worker                               (prefill)
  D    a decode worker                                       (decode)
  P+D  a combined worker, prefill and decode on one GPU      (combined)
An allocation is complete when every request can be served: some GPU encodes, some prefills, some
decodes, any P or E+P has a D worker to send its KV cache to (the launcher's rule), any D has a
P or E+P to receive from (a combined P+D worker never hands a KV cache off), and any E has a P or P+D
to send its prefills to (an E+P GPU's local worker only serves its own encoder).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coordinator.planner.catalog import Catalog
from coordinator.planner.variants import DEFAULT, Variant, service_key, split_key
from coordinator.protocol.roles import NODE_ROLES as ROLES, NodeRole as Role

CanHost = Callable[[str, Role], bool]
"""Whether a tier can play a role at all (weights fit in memory): (tier, role) -> bool."""


class GpuGroup(BaseModel):
    """`count` GPUs of one tier playing one role."""

    model_config = ConfigDict(frozen=True)

    tier: str
    """Catalog tier name (canonical: resolve aliases with Catalog.resolve first)."""
    role: Role
    """What every GPU of the group runs; see the module docstring."""
    count: int = Field(ge=1)
    """How many GPUs."""
    variant: Variant = DEFAULT
    """LLM workers' weight dtype and tensor-parallel degree (variants.py): count // tp workers of tp GPUs each.
    E GPUs hold no LLM (bf16 TP 1 only); an E+P GPU's local worker spans that one GPU (TP 1)."""

    @model_validator(mode="after")
    def _variant_fits_role(self) -> GpuGroup:
        if self.role == "E" and not self.variant.is_default:
            raise ValueError(f"{self.label()}: an E GPU runs no LLM worker, so it has no variant")
        if self.role == "E+P" and self.variant.tp != 1:
            raise ValueError(f"{self.label()}: an E+P GPU's local prefill worker runs on that GPU alone (tp 1)")
        if self.count % self.variant.tp:
            raise ValueError(f"{self.label()}: {self.count} GPUs do not make whole tp-{self.variant.tp} workers")
        return self

    @property
    def key(self) -> str:
        """The service key its workers are timed and priced under (variants.py)."""
        return service_key(self.tier, self.variant)

    @property
    def workers(self) -> int:
        return self.count // self.variant.tp

    def label(self) -> str:
        return f"{self.count}x{self.key}:{self.role}"


class Allocation(BaseModel):
    """A cluster layout: groups merged by (tier, role) and kept in role order, so equal layouts compare equal."""

    model_config = ConfigDict(frozen=True)

    groups: tuple[GpuGroup, ...]
    """The GPU groups; build with `Allocation.of(...)` or `parse_allocation`."""

    @model_validator(mode="after")
    def _normalise(self) -> Allocation:
        counts: dict[tuple[str, Role, Variant], int] = {}
        for g in self.groups:
            counts[(g.tier, g.role, g.variant)] = counts.get((g.tier, g.role, g.variant), 0) + g.count
        ordered = sorted(counts.items(), key=lambda kv: (ROLES.index(kv[0][1]), kv[0][0], kv[0][2].suffix()))
        object.__setattr__(self, "groups", tuple(GpuGroup(tier=t, role=r, count=c, variant=v)
                                                 for (t, r, v), c in ordered))
        missing = missing_stages(self.count)
        if missing:
            raise ValueError(f"allocation {self.label()} cannot serve requests: {missing}")
        return self

    @classmethod
    def of(cls, *groups: tuple[int, str, Role]) -> Allocation:
        """Allocation.of((2, "RTX4090", "E"), (2, "A100-80GB[int8/tp2]", "P+D")): tiers or service keys."""
        out = []
        for n, key, r in groups:
            tier, variant = split_key(key)
            out.append(GpuGroup(count=n, tier=tier, role=r, variant=variant))
        return cls(groups=tuple(out))

    def count(self, *roles: Role) -> int:
        """GPUs playing any of `roles`."""
        return sum(g.count for g in self.groups if g.role in roles)

    def members(self, role: Role) -> list[tuple[str, int]]:
        """(tier, count) of the groups playing `role`."""
        return [(g.tier, g.count) for g in self.groups if g.role == role]

    def workers(self, role: Role) -> list[tuple[str, int]]:
        """(service key, workers) of the groups playing `role`: a tp-2 group of 4 GPUs is 2 workers."""
        return [(g.key, g.workers) for g in self.groups if g.role == role]

    def simulated_only(self) -> list[str]:
        """Why the engine here cannot run this layout live (one reason per variant); [] when it can."""
        return sorted({f"{g.key}: {why}" for g in self.groups if (why := g.variant.runs_live())})

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.groups)

    def gpus_by_tier(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.tier] = out.get(g.tier, 0) + g.count
        return out

    def cost_per_hour(self, catalog: Catalog) -> float:
        return sum(catalog.tier(g.tier).price_per_hour * g.count for g in self.groups)

    def label(self) -> str:
        """E.g. "2xRTX4090:E,2xA100-80GB[int8/tp2]:P+D"; parse_allocation reads it back."""
        return ",".join(g.label() for g in self.groups)


def missing_stages(count: Callable[..., int]) -> str:
    """Why a layout with these role counts cannot serve requests; "" when it can."""
    problems = []
    if count("E", "E+P") == 0:
        problems.append("no encode GPU (E or E+P)")
    if count("E+P", "P", "P+D") == 0:
        problems.append("no prefill GPU (E+P, P or P+D)")
    if count("D", "P+D") == 0:
        problems.append("no decode GPU (D or P+D)")
    elif count("P", "E+P") and count("D") == 0:
        problems.append("P and E+P send KV caches to a D worker, and there is none")
    if count("D") and count("P", "E+P") == 0:
        problems.append("D workers only take KV caches from P or E+P workers, and there are none")
    if count("E") and count("P", "P+D") == 0:
        problems.append("E GPUs send every prefill to a P or P+D GPU (never to another GPU's local worker), "
                        "and there is none")
    return "; ".join(problems)


_ITEM = re.compile(r"^\s*(\d+)\s*[xX*]\s*([^:\s]+)\s*(?::\s*(\S+))?\s*$")


def _items(spec: str, what: str) -> list[tuple[int, str, str | None]]:
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _ITEM.match(part)
        if not m or int(m.group(1)) < 1:
            raise ValueError(f"bad {what} entry {part!r} in {spec!r}; write COUNTxTIER"
                             f"{':ROLE' if what == 'allocation' else ''}, e.g. 2xRTX4090")
        out.append((int(m.group(1)), m.group(2), m.group(3)))
    if not out:
        raise ValueError(f"empty {what} {spec!r}; write e.g. 2xRTX4090,2xA100-80GB")
    return out


def parse_inventory(spec: str, catalog: Catalog) -> dict[str, int]:
    """"2xRTX4090,2xA100" -> {"RTX4090": 2, "A100-80GB": 2} (aliases resolved, repeats summed)."""
    inventory: dict[str, int] = {}
    for n, tier, role in _items(spec, "inventory"):
        if role is not None:
            raise ValueError(f"an inventory lists GPUs without roles; drop ':{role}' from {spec!r}")
        name = catalog.resolve(tier)
        inventory[name] = inventory.get(name, 0) + n
    return inventory


def parse_allocation(spec: str, catalog: Catalog | None = None) -> Allocation:
    """"2xRTX4090:E,2xA100:P+D" -> Allocation; tiers resolved through `catalog` when given."""
    groups = []
    for n, tier, role in _items(spec, "allocation"):
        if role not in ROLES:
            raise ValueError(f"role {role!r} in {spec!r} is not one of {', '.join(ROLES)}")
        base, variant = split_key(tier)
        groups.append((n, service_key(catalog.resolve(base) if catalog else base, variant), role))
    return Allocation.of(*groups)


def worker_price(catalog: Catalog, key: str) -> float:
    """$/h of one worker of service key `key`: its tier's price times the GPUs it spans."""
    tier, variant = split_key(key)
    return catalog.tier(tier).price_per_hour * variant.tp


def _splits(n: int, parts: int) -> Iterable[tuple[int, ...]]:
    """Every way to write n as an ordered sum of `parts` non-negative integers."""
    for bars in itertools.combinations(range(n + parts - 1), parts - 1):
        edges = (-1, *bars, n + parts - 1)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(parts))


def _complete(groups: list[tuple[int, str, Role]]) -> bool:
    return not missing_stages(lambda *roles: sum(n for n, _, r in groups if r in roles))


def enumerate_inventory(inventory: Mapping[str, int], can_host: CanHost | None = None,
                        max_allocations: int = 200_000) -> list[Allocation]:
    """Every complete way to give each GPU of `inventory` a role or leave it unused (unused GPUs cost
    nothing, so smaller layouts compete on cost per goodput)."""
    per_tier = [[tuple((n, tier, r) for n, r in zip(split, ROLES, strict=False) if n)
                 for split in _splits(count, len(ROLES) + 1)] for tier, count in inventory.items()]
    total = 1
    for options in per_tier:
        total *= len(options)
    if total > max_allocations:
        raise ValueError(f"inventory {dict(inventory)} has {total} role assignments, over max_allocations="
                         f"{max_allocations}; list fewer GPUs or tiers, or raise the limit")
    out = []
    for combo in itertools.product(*per_tier):
        groups = [g for tier_groups in combo for g in tier_groups]
        if _complete(groups) and (can_host is None or all(can_host(t, r) for _, t, r in groups)):
            out.append(Allocation.of(*groups))
    return out


def enumerate_budget(catalog: Catalog, budget_per_hour: float, tiers: Iterable[str] | None = None,
                     max_gpus: int = 8, can_host: CanHost | None = None) -> list[Allocation]:
    """Complete allocations costing at most `budget_per_hour`, with at most `max_gpus` GPUs.

    The space is kept to HeteroServe's shape: one tier for the encode GPUs (E, E+P) and one tier for
    the language GPUs (P, D, P+D), which may be the same tier. Mixing more tiers per side multiplies
    the space without adding a kind of layout; list those in an inventory instead. `tiers` defaults
    to every gpu-kind tier (the cpu pseudo-tier only when named).
    """
    if budget_per_hour <= 0:
        raise ValueError(f"budget_per_hour must be > 0, got {budget_per_hour!r}")
    names = [catalog.resolve(t) for t in tiers] if tiers is not None else catalog.names("gpu")
    price = {t: catalog.tier(t).price_per_hour for t in names}
    out = []
    for enc, lang in itertools.product(names, repeat=2):
        for n_e, n_l in itertools.product(range(max_gpus + 1), repeat=2):
            if n_e + n_l == 0 or n_e + n_l > max_gpus:
                continue
            left = max_gpus - n_e - n_l
            for n_p, n_d, n_pd in itertools.product(range(left + 1), repeat=3):
                n_lang = n_p + n_d + n_pd
                if n_lang > left or price[enc] * (n_e + n_l) + price[lang] * n_lang > budget_per_hour + 1e-9:
                    continue
                groups = [(n, t, r) for n, t, r in ((n_e, enc, "E"), (n_l, enc, "E+P"), (n_p, lang, "P"),
                                                    (n_d, lang, "D"), (n_pd, lang, "P+D")) if n]
                if _complete(groups) and (can_host is None or all(can_host(t, r) for _, t, r in groups)):
                    out.append(Allocation.of(*groups))
    return list(dict.fromkeys(out))
