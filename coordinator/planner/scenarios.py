"""The workloads the planner plans for, and what the queueing model and the engines need to know of them.

`default_workload` builds the request mix for one modality of one model, modelled on the seeds'
experimental setups (EAServe: Lambda = 5 req/s, Poisson arrivals; images for LLaVA, video clips for
Qwen2.5-VL, audio clips for Ultravox). The numbers below are the planner's defaults, not the seeds'
(the seeds do not give prompt or output lengths): each is a documented guess, and a plan file records
the workload it was planned for, so a reader can see what was assumed.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.arch import ModelArch
from coordinator.planner.capacity import (
    CapacityConfig,
    RequestShape,
    kv_bytes_per_request,
    kv_room,
)
from coordinator.planner.catalog import Catalog
from coordinator.planner.deployment import EngineLimits
from coordinator.planner.service import Modality
from coordinator.planner.workload import (
    ArrivalProcess,
    LogNormal,
    RequestClass,
    Uniform,
    Workload,
)


class MixConfig(BaseModel):
    """Request lengths of the default workloads (guesses; the seeds give none)."""

    model_config = ConfigDict(frozen=True)

    text_tokens: tuple[int, int] = (32, 96)
    """Text prompt tokens besides the media, uniform on [low, high]."""
    output_mean: float = Field(128.0, gt=0)
    """Mean generated tokens (lognormal: chat answers have a long tail)."""
    output_cv: float = Field(0.5, gt=0)
    """Coefficient of variation of generated tokens."""
    output_range: tuple[int, int] = (16, 512)
    """Generated tokens are clipped to [low, high]."""
    video_frames: int = Field(8, ge=1)
    """Frames sampled per video clip (one clip per request)."""
    audio_seconds: tuple[int, int] = (5, 30)
    """Audio clip length in seconds, uniform (30 s is one Whisper chunk)."""


class IntRange(BaseModel):
    """An inclusive integer range."""

    model_config = ConfigDict(frozen=True)
    low: int = Field(ge=1)
    """Smallest value."""
    high: int = Field(ge=1)
    """Largest value."""


def media_tokens(arch: ModelArch, modality: Modality, mix: MixConfig) -> IntRange:
    """(low, high) embedding tokens of one request's media item."""
    per = arch.tokens_per_item(modality)
    if modality == "image":
        return IntRange(low=int(per), high=int(per))
    if modality == "video":
        n = round(per * mix.video_frames)
        return IntRange(low=n, high=n)
    low, high = mix.audio_seconds
    return IntRange(low=max(1, round(per * low)), high=max(1, round(per * high)))


def _token_count(arch: ModelArch, modality: Modality) -> float | None:
    try:
        return arch.tokens_per_item(modality)
    except ValueError:
        return None


def default_workload(arch: ModelArch, modality: Modality, rate: float, mix: MixConfig | None = None,
                     cv: float = 1.0) -> Workload:
    """One request class of `modality` for `arch` at `rate` req/s (Poisson; gamma gaps when cv != 1)."""
    mix = mix or MixConfig()
    usable = [m for m in arch.modalities() if _token_count(arch, m) is not None]
    if modality not in usable:
        raise ValueError(f"model {arch.name!r} has no {modality} workload (it takes {usable}); pick one of those "
                         f"with --modality, or a model that takes {modality}")
    tokens = media_tokens(arch, modality, mix)
    per_item = tokens.low if tokens.low == tokens.high else Uniform(low=tokens.low, high=tokens.high)
    arrivals = ArrivalProcess(rate=rate) if cv == 1.0 else ArrivalProcess(rate=rate, kind="gamma", cv=cv)
    return Workload(arrivals=arrivals, mix=[RequestClass(
        modality=modality, tokens_per_item=per_item,
        prompt_tokens=Uniform(low=mix.text_tokens[0], high=mix.text_tokens[1]),
        output_tokens=LogNormal(mean=mix.output_mean, cv=mix.output_cv, low=mix.output_range[0],
                                high=mix.output_range[1]))])


def mean_shape(workload: Workload, samples: int = 2000, seed: int = 0) -> RequestShape:
    """The average request, as HAS stage 1's capacities take it, from a sample of the workload.

    The queueing model knows one request shape; a mix of modalities is represented by its most
    frequent modality (a limitation: plan mixed workloads with care)."""
    reqs = workload.generate(samples, seed=seed)
    counts: dict[Modality, int] = {}
    for r in reqs:
        counts[r.modality] = counts.get(r.modality, 0) + 1
    modality = max(counts, key=lambda m: counts[m])
    return RequestShape(
        modality=modality,
        media_tokens=max(1, round(float(np.mean([r.embedding_tokens for r in reqs])))),
        text_tokens=round(float(np.mean([r.text_tokens for r in reqs]))),
        output_tokens=max(1, round(float(np.mean([r.output_tokens for r in reqs])))))


def engine_limits(catalog: Catalog, arch: ModelArch, shape: RequestShape, llm_tiers: list[str], longest_prompt: int,
                  max_num_seqs: int = 32, capacity: CapacityConfig | None = None) -> EngineLimits:
    """Engine batching limits for a layout whose language work runs on `llm_tiers`.

    The simulator does not model KV-cache memory, so the sequence cap is lowered to what the
    smallest LLM GPU's memory holds after the weights (a 34B model on an 80 GB GPU: a handful);
    the token budget stays llm_node's default (8192) unless `longest_prompt` needs more (no chunked prefill)."""
    cfg = capacity or CapacityConfig()
    per_request = kv_bytes_per_request(arch, shape)
    fits = [max_num_seqs]
    for tier in llm_tiers:  # a tier name or a variant's service key: the room on each of its GPUs
        free, share = kv_room(catalog, arch, tier, cfg)
        fits.append(max(1, math.floor(free / (per_request * share))) if free > 0 else 1)
    seqs = min(fits)
    return EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=max(8192, seqs, longest_prompt))
