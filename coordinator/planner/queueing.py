"""HAS stage 1: score allocations with an open-queue model, prune them, and seed stage 2's ranges.

Each stage sigma in {E, P, D} is an open queue; its utilisation is rho = arrival rate / capacity. With
n identical workers of capacity C that is EAServe's rho_sigma = (Lambda / n_sigma) / C_sigma. With
GPUs of several tiers in a stage the stage's capacity is the SUM of its workers' capacities (requests
spread in proportion to speed, which is what the dispatcher's least-loaded routing tends to).

Requests take one of two paths. The split path prefills on a P GPU or on the local prefill worker of
an E+P GPU and decodes on a D GPU; the combined path runs both on one P+D GPU (a combined worker
never hands off or takes KV caches). A share f of the requests takes the split path:

  S_P = sum C_P(P GPUs) + alpha * sum C_P(E+P GPUs)     S_D = sum C_D(D GPUs)
  S_C = sum over P+D GPUs of 1 / (1/C_P + 1/C_D)         (one GPU doing a whole request)
  rho_E = Lambda / sum C_E(E and E+P GPUs)
  rho_P = max(f Lambda / S_P, rho_C)   rho_D = max(f Lambda / S_D, rho_C)   rho_C = (1 - f) Lambda / S_C

with f = min(S_P, S_D) / (min(S_P, S_D) + S_C), the routing that loads both paths' bottlenecks
equally. Without P+D GPUs f = 1 and rho_P is EAServe's Lambda / (C_P (n_P + n_L alpha)): a local
prefill worker on an encode GPU counts as alpha of a full one (alpha = the encode GPU's memory
budget share for it; the planner uses alpha = 1 - rho_E instead, the time the encoder leaves idle).
Encoding keeps the whole GPU in rho_E: the SM split is stage 2's knob. Work
stealing is not modelled here (it only adds capacity).

score = max(rho_E, rho_P, rho_D). Filters: drop any rho >= 1, drop scores above 1.2x the best, keep
the top K = 3. Seeds for stage 2: B_max = ceil(Lambda / n_E), and s in s* +- 0.2 (clipped to [0, 1])
with s* = C_remote / (C_remote + C_local), exactly as EAServe states it (see `s_window`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.allocation import Allocation, Role
from coordinator.planner.capacity import TierCapacity
from coordinator.planner.catalog import Catalog


class StageLoads(BaseModel):
    """Utilisations of one allocation at one arrival rate."""

    model_config = ConfigDict(frozen=True)

    rho_e: float
    """Encode utilisation."""
    rho_p: float
    """Prefill utilisation (local workers weighted by alpha)."""
    rho_d: float
    """Decode utilisation."""
    c_remote: float
    """Capacity of the remote targets of an encode worker's prefills, req/s: P GPUs plus P+D GPUs
    (each counted as whole requests, 1 / (1/C_P + 1/C_D))."""
    c_local: float
    """Prefill capacity of the local workers on E+P GPUs, already scaled by alpha, req/s."""
    split_share: float
    """f: the share of requests taking the split path (P or E+P, then D); the rest go to P+D GPUs."""

    @property
    def score(self) -> float:
        """HAS's bottleneck score: the busiest stage's utilisation."""
        return max(self.rho_e, self.rho_p, self.rho_d)


def _rho(rate: float, capacity: float) -> float:
    return rate / capacity if capacity > 0 else math.inf


def _cap(alloc: Allocation, caps: Mapping[str, TierCapacity], tier: str) -> TierCapacity:
    try:
        return caps[tier]
    except KeyError:
        raise KeyError(f"no capacities for tier {tier!r} (allocation {alloc.label()}); have {sorted(caps)}: "
                       f"compute them with capacity.capacities(...)") from None


def _sum(alloc: Allocation, role: Role, caps: Mapping[str, TierCapacity], field: str) -> float:
    """Sum over the role's workers (a tensor-parallel worker of several GPUs counts once, at its own capacity)."""
    return sum(n * getattr(_cap(alloc, caps, key), field) for key, n in alloc.workers(role))


def stage_loads(alloc: Allocation, rate: float, caps: Mapping[str, TierCapacity], alpha: float | None) -> StageLoads:
    """rho_E, rho_P, rho_D of `alloc` at arrival rate `rate` (req/s); see the module docstring. alpha None: a
    local prefill worker gets the share of its GPU the encoder leaves idle, 1 - rho_E (time sharing)."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be > 0 req/s, got {rate!r}")
    if alpha is not None and not 0 <= alpha <= 1:
        raise ValueError(f"alpha (encode-GPU memory share for local prefill) must be in [0, 1], got {alpha!r}")
    c_e = _sum(alloc, "E", caps, "encode") + _sum(alloc, "E+P", caps, "encode")
    share = alpha if alpha is not None else max(0.0, 1.0 - _rho(rate, c_e))
    c_local = share * _sum(alloc, "E+P", caps, "local_prefill")
    s_p = _sum(alloc, "P", caps, "prefill") + c_local
    s_d = _sum(alloc, "D", caps, "decode")
    s_c = 0.0
    for tier, n in alloc.workers("P+D"):
        p, d = _cap(alloc, caps, tier).prefill, _cap(alloc, caps, tier).decode
        s_c += n / (1 / p + 1 / d) if p > 0 and d > 0 else 0.0
    split = min(s_p, s_d)
    f = split / (split + s_c) if split + s_c > 0 else 1.0
    rho_c = _rho((1 - f) * rate, s_c) if f < 1 else 0.0
    rho_p = max(_rho(f * rate, s_p) if f > 0 else 0.0, rho_c)
    rho_d = max(_rho(f * rate, s_d) if f > 0 else 0.0, rho_c)
    return StageLoads(rho_e=_rho(rate, c_e), rho_p=rho_p, rho_d=rho_d,
                      c_remote=s_p - c_local + s_c, c_local=c_local, split_share=f)


def b_max(rate: float, n_encode: int) -> int:
    """Stage 2's cap on the encode batch: ceil(Lambda / n_E), at least 1 (a larger batch would wait
    longer than a second of arrivals to fill)."""
    if n_encode < 1:
        raise ValueError(f"n_encode must be >= 1, got {n_encode!r}")
    return max(1, math.ceil(rate / n_encode - 1e-9))


def s_window(c_remote: float, c_local: float, half_width: float = 0.2) -> tuple[float, float, float]:
    """(low, high, s*) for stage 2's offload-share search: s* = C_remote / (C_remote + C_local), +-
    half_width, clipped to [0, 1]. With no local prefill capacity s is moot: (0, 0, 0).

    The formula is EAServe's as DESIGN.md restates it. Note that with s the share routed LOCAL, the
    split that loads both sides equally is C_local / (C_remote + C_local); the two agree only when
    C_local = C_remote. Kept as stated until the paper's definition is checked; stage 2 searches
    the window either way.
    """
    if c_local <= 0:
        return 0.0, 0.0, 0.0
    star = c_remote / (c_remote + c_local)
    return max(0.0, star - half_width), min(1.0, star + half_width), star


class Stage1Config(BaseModel):
    """HAS stage 1's constants (the seeds' values by default)."""

    model_config = ConfigDict(frozen=True)

    alpha: float | None = Field(0.5, ge=0, le=1)
    """Encode-GPU memory budget share of a local prefill worker (its weight in rho_P); an assumption:
    the seeds give no value. None: the share the encoder leaves idle, 1 - rho_E (the planner's choice: a
    constant 0.5 priced a lightly loaded E+P GPU's prefill at half and hid the cheapest layouts; see
    benchmarks/results/planner_suite.md)."""
    slack: float = Field(1.2, ge=1)
    """Drop allocations ranking worse than slack x the best."""
    top_k: int = Field(3, ge=1)
    """Keep at most this many."""
    s_half_width: float = Field(0.2, ge=0, le=1)
    """Half-width of the s window around s*."""
    rank_by: Literal["score", "cost", "price"] = "score"
    """score: EAServe's max-rho (prefers the least loaded, usually the largest, layout). cost: score x
    $/h, i.e. dollars per req/s the layout sustains at its bottleneck (rho=1): tierserve's objective,
    goodput per dollar, before stage 2 measures latency. price: $/h alone (ties: lower score first):
    at a fixed planned rate every layout that keeps up serves the same goodput, so the cheapest one
    with enough headroom (max_score) wins; "cost" would prefer large idle layouts there."""
    max_score: float = Field(1.0, gt=0, le=1)
    """Drop allocations whose score reaches this (the seeds: 1, i.e. any stage at capacity); a planner
    ranking by price sets it lower to keep latency headroom."""


class Candidate(BaseModel):
    """An allocation that survived stage 1, with the ranges stage 2 searches."""

    model_config = ConfigDict(frozen=True)

    allocation: Allocation
    """The layout."""
    loads: StageLoads
    """Its utilisations at the planned rate."""
    cost_per_hour: float
    """Its price, $/h."""
    rank_value: float
    """What it was ranked by (score, or score x $/h)."""
    b_max: int
    """Largest encode batch stage 2 tries."""
    s_range: tuple[float, float]
    """Offload shares stage 2 tries, [low, high]."""
    s_star: float
    """The window's centre."""


class Stage1Result(BaseModel):
    """The survivors and how many allocations each filter removed (for the report: "kept 3 of 7")."""

    model_config = ConfigDict(frozen=True)

    candidates: tuple[Candidate, ...]
    """The kept allocations, best first."""
    considered: int
    """Allocations scored."""
    feasible: int
    """Those with every rho < 1 (below max_score)."""
    within_slack: int
    """Those also ranking within slack x the best."""


def stage1(allocations: Iterable[Allocation], rate: float, caps: Mapping[str, TierCapacity], catalog: Catalog,
           config: Stage1Config | None = None) -> Stage1Result:
    """Score every allocation at `rate`, apply the three filters, and seed B_max and the s window."""
    cfg = config or Stage1Config()
    scored = []
    considered = 0
    for alloc in allocations:
        considered += 1
        loads = stage_loads(alloc, rate, caps, cfg.alpha)
        if loads.score >= cfg.max_score:
            continue
        cost = alloc.cost_per_hour(catalog)
        rank = {"score": loads.score, "cost": loads.score * cost, "price": cost}[cfg.rank_by]
        scored.append((rank, loads.score, cost, alloc.label(), alloc, loads))
    scored.sort(key=lambda item: item[:4])
    best = scored[0][0] if scored else 0.0
    within = [item for item in scored if item[0] <= cfg.slack * best + 1e-12]
    kept = []
    for rank, _, cost, _, alloc, loads in within[:cfg.top_k]:
        low, high, star = s_window(loads.c_remote, loads.c_local, cfg.s_half_width)
        kept.append(Candidate(allocation=alloc, loads=loads, cost_per_hour=cost, rank_value=rank,
                              b_max=b_max(rate, alloc.count("E", "E+P")), s_range=(low, high), s_star=star))
    return Stage1Result(candidates=tuple(kept), considered=considered, feasible=len(scored),
                        within_slack=len(within))
