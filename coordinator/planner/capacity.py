"""Per-worker capacities C_E, C_P, C_D of each tier (HAS stage 1), from any ServiceTimes.

HAS measures them on isolated workers: C_E by doubling the encode batch B until throughput saturates,
C_P and C_D with stress workloads. Here the same procedures run against a ServiceTimes (measured
profiles or the roofline), for the average request of the workload. A stage whose weights and one
request's KV cache do not fit in the tier's memory gets capacity 0, so the queueing model never
places it there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.allocation import CanHost, Role
from coordinator.planner.arch import ModelArch
from coordinator.planner.catalog import Catalog
from coordinator.planner.service import Modality, ServiceTimes
from coordinator.planner.variant_perf import kv_share, weights_per_gpu
from coordinator.planner.variants import service_key, split_key


class RequestShape(BaseModel):
    """The average request of a workload, as the capacities see it."""

    model_config = ConfigDict(frozen=True)

    modality: Modality
    """Which encoder the request needs."""
    media_tokens: int = Field(ge=1)
    """Embedding tokens of the request's media (one encoder item: an image, a clip's frames, an audio)."""
    text_tokens: int = Field(0, ge=0)
    """Prompt tokens besides the media."""
    output_tokens: int = Field(1, ge=1)
    """Generated tokens; the first comes from prefill, the rest from decode steps."""

    @property
    def prompt_tokens(self) -> int:
        return self.media_tokens + self.text_tokens


class CapacityConfig(BaseModel):
    """How the stress procedures run."""

    model_config = ConfigDict(frozen=True)

    max_encode_batch: int = Field(64, ge=1)
    """Largest B tried when doubling."""
    saturation_gain: float = Field(1.05, gt=1)
    """Doubling stops when it raises encode throughput by less than this factor."""
    max_prefill_tokens: int = Field(8192, ge=1)
    """Token budget of one batched prefill (vLLM's max_num_batched_tokens); one prompt always fits."""
    max_decode_batch: int = Field(256, ge=1)
    """Most sequences in one decode step."""
    memory_utilisation: float = Field(0.9, gt=0, le=1)
    """Share of GPU memory for weights plus KV cache (the rest: activations, CUDA context)."""
    tpot_slo_s: float | None = Field(None, gt=0)
    """If set, decode batches are capped so one step stays within this TPOT."""


class TierCapacity(BaseModel):
    """Capacities of one tier's workers (req/s), as HAS stage 1 uses them."""

    model_config = ConfigDict(frozen=True)

    tier: str
    """Catalog tier name."""
    encode: float = Field(ge=0)
    """C_E: requests/s one encode worker sustains at its saturating batch."""
    prefill: float = Field(ge=0)
    """C_P: requests/s one prefill worker sustains with the whole GPU."""
    decode: float = Field(ge=0)
    """C_D: requests/s one decode worker sustains; inf when requests need no decode step."""
    local_prefill: float = Field(0.0, ge=0)
    """C_P of a prefill worker sharing the GPU with the encoder (0 when both do not fit); the queueing
    model scales it by alpha."""
    encode_batch: int = Field(1, ge=1)
    """The B at which encode throughput saturated."""
    decode_batch: int = Field(0, ge=0)
    """Sequences per decode step behind C_D (memory- or TPOT-capped)."""


def _doublings(limit: int) -> list[int]:
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out


def kv_bytes_per_request(arch: ModelArch, shape: RequestShape) -> float:
    """KV cache of one finished request (prompt + every generated token)."""
    return arch.kv_bytes_per_token() * (shape.prompt_tokens + shape.output_tokens)


def canonical_key(catalog: Catalog, key: str) -> str:
    """A worker's service key with its tier's canonical name: "A100[int8/tp2]" -> "A100-80GB[int8/tp2]"."""
    tier, variant = split_key(key)
    return service_key(catalog.resolve(tier), variant)


def kv_room(catalog: Catalog, arch: ModelArch, key: str, cfg: CapacityConfig) -> tuple[float, float]:
    """(bytes left for KV cache on each GPU of a `key` worker after its weights, its GPUs' share of a KV cache)."""
    tier, variant = split_key(key)
    memory = catalog.tier(tier).memory_gb * 1e9 * cfg.memory_utilisation
    return memory - weights_per_gpu(arch, variant), kv_share(arch, variant)


def fits(catalog: Catalog, arch: ModelArch, shape: RequestShape, tier: str, role: Role,
         config: CapacityConfig | None = None) -> bool:
    """Whether `role`'s weights plus one request's KV cache fit in usable memory: for an LLM role, on each
    GPU of a worker of `tier`'s variant (a service key, variants.py); an encoder needs its own weights too."""
    cfg = config or CapacityConfig()
    room, share = kv_room(catalog, arch, tier, cfg)
    need = kv_bytes_per_request(arch, shape) * share
    if role == "E":
        return arch.encoder_weight_bytes() <= room + weights_per_gpu(arch, split_key(tier)[1])
    if role == "E+P":
        return split_key(tier)[1].tp == 1 and arch.encoder_weight_bytes() + need <= room
    return need <= room


def host_check(catalog: Catalog, arch: ModelArch, shape: RequestShape,
               config: CapacityConfig | None = None) -> CanHost:
    """`fits` as the (tier, role) predicate the allocation enumerators take."""
    return lambda tier, role: fits(catalog, arch, shape, tier, role, config)


def encode_capacity(times: ServiceTimes, tier: str, shape: RequestShape, cfg: CapacityConfig) -> tuple[float, int]:
    """(C_E, B): double B until throughput gains less than saturation_gain; keep the best seen."""
    best, best_b = 0.0, 1
    for b in _doublings(cfg.max_encode_batch):
        seconds = times.encode_s(tier, shape.modality, b, shape.media_tokens)
        rate = b / seconds if seconds > 0 else math.inf
        if best and rate < best * cfg.saturation_gain:
            if rate > best:
                best, best_b = rate, b
            break
        best, best_b = rate, b
    return best, best_b


def prefill_capacity(times: ServiceTimes, tier: str, shape: RequestShape, cfg: CapacityConfig) -> float:
    """C_P: the best requests/s over batches of whole prompts within the token budget."""
    prompt = shape.prompt_tokens
    batches = _doublings(max(1, cfg.max_prefill_tokens // prompt))
    return max(b / max(times.prefill_s(tier, b * prompt), 1e-12) for b in batches)


def decode_capacity(times: ServiceTimes, catalog: Catalog, arch: ModelArch, tier: str, shape: RequestShape,
                    cfg: CapacityConfig) -> tuple[float, int]:
    """(C_D, batch): steady state with `batch` sequences in flight, each at mid-generation context.

    A request needs output_tokens - 1 steps; the batch is the largest the KV memory (and the TPOT
    SLO, if set) allows, trying doublings and the cap itself.
    """
    steps = shape.output_tokens - 1
    if steps == 0:
        return math.inf, 0
    free, share = kv_room(catalog, arch, tier, cfg)
    cap = min(cfg.max_decode_batch, int(free // (kv_bytes_per_request(arch, shape) * share))) if free > 0 else 0
    context = shape.prompt_tokens + shape.output_tokens / 2
    best, best_b = 0.0, 0
    for b in sorted({*_doublings(cap), cap}) if cap >= 1 else []:
        step = times.decode_step_s(tier, b, int(round(b * context)))
        if cfg.tpot_slo_s is not None and step > cfg.tpot_slo_s and b > 1:
            break
        rate = b / (steps * max(step, 1e-12))
        if rate > best:
            best, best_b = rate, b
    return best, best_b


def tier_capacity(times: ServiceTimes, catalog: Catalog, arch: ModelArch, tier: str, shape: RequestShape,
                  config: CapacityConfig | None = None) -> TierCapacity:
    """Every capacity of one tier's worker (a tier name or a variant's service key); roles that do not fit get 0."""
    cfg = config or CapacityConfig()
    name = canonical_key(catalog, tier)
    ok = {role: fits(catalog, arch, shape, name, role, cfg) for role in ("E", "E+P", "P")}
    c_e, b_e = encode_capacity(times, name, shape, cfg) if ok["E"] else (0.0, 1)
    c_p = prefill_capacity(times, name, shape, cfg) if ok["P"] else 0.0
    c_d, b_d = decode_capacity(times, catalog, arch, name, shape, cfg) if ok["P"] else (0.0, 0)
    return TierCapacity(tier=name, encode=c_e, prefill=c_p, decode=c_d, local_prefill=c_p if ok["E+P"] else 0.0,
                        encode_batch=b_e, decode_batch=b_d)


def capacities(times: ServiceTimes, catalog: Catalog, arch: ModelArch, tiers: Iterable[str], shape: RequestShape,
               config: CapacityConfig | None = None) -> dict[str, TierCapacity]:
    """tier_capacity for each tier, keyed by canonical name (what the queueing model looks up)."""
    return {canonical_key(catalog, t): tier_capacity(times, catalog, arch, t, shape, config) for t in tiers}
