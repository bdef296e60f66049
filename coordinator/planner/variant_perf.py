"""Speed and memory of an LLM worker's deployment variant (variants.py), relative to bf16 on one GPU.

PerfModel times a variant worker as its bf16, one-GPU time (measured or roofline) times the ratio of
the two roofline estimates below, so a measured profile keeps its calibration and the variant adds
only what the roofline says it changes: fewer bytes per weight, FP8 tensor cores where the tier has
them, 1/tp of the work per GPU, and the all-reduces tensor parallelism adds (variants.py gives the
sources). Memory fit: `weights_per_gpu` + `kv_share` of each request's KV cache.
"""

from __future__ import annotations

from coordinator.planner.arch import ModelArch
from coordinator.planner.catalog import Tier
from coordinator.planner.variants import BYTES_PER_WEIGHT, Variant

ACTIVATION_BYTES = 2
"""Hidden states cross the all-reduce in bf16 whatever the weight dtype."""


def weights_per_gpu(arch: ModelArch, variant: Variant) -> float:
    """Bytes of LLM weights each GPU of a `variant` worker holds."""
    return arch.llm.params * BYTES_PER_WEIGHT[variant.dtype] / variant.tp


def kv_share(arch: ModelArch, variant: Variant) -> float:
    """Share of a request's KV cache each GPU holds: heads split over tp GPUs, replicated beyond kv_heads."""
    return 1.0 / min(variant.tp, arch.llm.kv_heads)


def peak_flops(tier: Tier, variant: Variant) -> float:
    """FLOP/s peak the variant's GEMMs run at: FP8 tensor cores for fp8 where the tier has them, else BF16."""
    if variant.dtype == "fp8" and tier.peak_fp8_tflops:
        return tier.peak_fp8_tflops * 1e12
    return tier.peak_flops


def allreduce_s(arch: ModelArch, tier: Tier, variant: Variant, tokens: int, link_latency_s: float) -> float:
    """Two ring all-reduces of `tokens` hidden states per layer across the worker's tp GPUs."""
    if variant.tp == 1 or tokens == 0:
        return 0.0
    link = tier.nvlink_gbs * 1e9 if tier.nvlink_gbs else tier.host_link_bytes_s
    message = tokens * arch.llm.hidden * ACTIVATION_BYTES
    one = 2 * (variant.tp - 1) / variant.tp * message / link + 2 * (variant.tp - 1) * link_latency_s
    return 2 * arch.llm.layers * one


def _scaled(arch: ModelArch, variant: Variant, flops: float, nbytes: float, kv_bytes: float) -> tuple[float, float]:
    """Per-GPU (FLOPs, bytes) of a bf16 one-GPU pass's (flops, nbytes), of which kv_bytes are KV cache."""
    weights = arch.llm_weight_bytes()
    rest = nbytes - weights - kv_bytes
    return flops / variant.tp, weights_per_gpu(arch, variant) + kv_bytes * kv_share(arch, variant) + rest / variant.tp


def time_ratio(arch: ModelArch, tier: Tier, variant: Variant, cost: tuple[float, float], kv: float, tokens: int,
               ce: float, me: float, overhead_s: float, link_latency_s: float) -> float:
    """Variant time / bf16 one-GPU time of a pass whose bf16 one-GPU roofline cost is `cost` (FLOPs, bytes),
    `kv` of those bytes KV cache, moving `tokens` hidden states through each layer (both times roofline)."""
    flops, nbytes = cost
    base = max(flops / (tier.peak_flops * ce), nbytes / (tier.bandwidth_bytes_s * me)) + overhead_s
    vf, vb = _scaled(arch, variant, flops, nbytes, kv)
    mine = (max(vf / (peak_flops(tier, variant) * ce), vb / (tier.bandwidth_bytes_s * me)) + overhead_s
            + allreduce_s(arch, tier, variant, tokens, link_latency_s))
    return mine / base


