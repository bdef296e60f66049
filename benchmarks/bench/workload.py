"""The workload: when requests arrive (the arrival process) and what each asks for (the request mix).

Arrivals follow `vllm bench serve`: gaps between requests are Gamma-distributed with shape
`burstiness` and mean 1/rate. burstiness 1 is a Poisson process; below 1 is burstier, above 1 more
regular (coefficient of variation of the gaps = 1/sqrt(burstiness)); rate inf sends everything at once.
Gaps are drawn once at unit rate and divided by each rate, so every rate of a sweep replays the same
trace shape and every system sees the same requests at the same offsets: the ratios between systems
come from one workload, not from two draws of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from benchmarks.bench.media import data_url, synthetic_image, synthetic_wav

Modality = Literal["text", "image", "video", "audio"]
WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "by", "at", "from", "that",
    "this", "it", "be", "or", "an", "have", "not", "which", "one", "all", "they", "were", "their", "has",
    "more", "been", "would", "when", "there", "some", "what", "also", "into", "only", "other", "time", "new",
    "could", "first", "these", "may", "such", "like", "then", "them", "two", "over", "most", "water", "colour",
    "light", "picture", "shape", "large", "small", "left", "right", "under", "above", "near", "far", "red",
    "green", "blue", "yellow", "white", "black", "round", "square", "line", "edge", "corner", "centre",
)
"""Prompt filler: common English words, about one token each for BPE tokenizers."""


class WorkloadError(ValueError):
    """A workload option that cannot be honoured; the message names the option and the value."""


def unit_gaps(n: int, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """n inter-arrival gaps with mean 1 and CV 1/sqrt(burstiness) (Gamma, shape = burstiness)."""
    if burstiness <= 0 or not math.isfinite(burstiness):
        raise WorkloadError(f"--burstiness must be a positive number, got {burstiness}")
    return rng.gamma(burstiness, 1.0 / burstiness, size=n)


def arrival_offsets(gaps: np.ndarray, rate: float) -> np.ndarray:
    """Seconds from the run's start at which each request is sent: the first at 0, then the unit gaps
    divided by `rate`; all zero for rate inf."""
    if rate <= 0 or math.isnan(rate):
        raise WorkloadError(f"request rates must be > 0 (or inf), got {rate}")
    if math.isinf(rate):
        return np.zeros(len(gaps))
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) / rate if len(gaps) else np.zeros(0)


class Length(BaseModel):
    """A token count: fixed, uniform on [a, b], or normal(mean a, sd b) rounded and floored at `floor`."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["fixed", "uniform", "normal"] = "fixed"
    a: float
    b: float = 0.0
    floor: int = 1
    """Smallest value drawn (1 for output tokens; 0 allowed for images per request)."""

    @classmethod
    def parse(cls, text: str, option: str, floor: int = 1) -> Length:
        """"64", "uniform:16:128" or "normal:64:16"."""
        m = re.fullmatch(r"\s*(?:(fixed|uniform|normal):)?(\d+(?:\.\d+)?)(?::(\d+(?:\.\d+)?))?\s*", text)
        if not m or (m.group(1) in ("uniform", "normal")) != (m.group(3) is not None):
            raise WorkloadError(f"{option} {text!r}: write N, uniform:LOW:HIGH or normal:MEAN:SD")
        kind = m.group(1) or "fixed"
        a, b = float(m.group(2)), float(m.group(3) or 0)
        if kind == "fixed" and a != int(a):
            raise WorkloadError(f"{option} {text!r}: a fixed count must be a whole number")
        if kind == "uniform" and b < a:
            raise WorkloadError(f"{option} {text!r}: uniform needs LOW <= HIGH")
        if a < floor:
            what = {"fixed": "the count", "uniform": "LOW", "normal": "MEAN"}[kind]
            raise WorkloadError(f"{option} {text!r}: {what} must be at least {floor}")
        return cls(kind=kind, a=a, b=b, floor=floor)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, self.a)
        elif self.kind == "uniform":
            out = rng.integers(int(self.a), int(self.b) + 1, size=n)
        else:
            out = np.rint(rng.normal(self.a, self.b, size=n))
        return np.maximum(out, self.floor).astype(np.int64)

    def label(self) -> str:
        return f"{int(self.a)}" if self.kind == "fixed" else f"{self.kind}:{self.a:g}:{self.b:g}"


class MixConfig(BaseModel):
    """What synthetic requests ask for; every field has a flag of the same name."""

    model_config = ConfigDict(frozen=True)

    modalities: dict[Modality, float] = Field(default_factory=lambda: {"image": 1.0})
    """Share of each request kind (weights, normalised); text requests carry no media."""
    images_per_request: Length = Length(a=1, floor=0)
    image_sizes: list[tuple[int, int]] = Field(default_factory=lambda: [(336, 336)])
    """(width, height) choices, one drawn per image with equal probability."""
    prompt_tokens: Length = Length(a=32)
    """Approximate: filler words, about one token each; the server's own count is recorded."""
    output_tokens: Length = Length(a=64)
    """max_tokens of each request (sent with ignore_eos unless --no-ignore-eos)."""
    audio_seconds: float = Field(2.0, gt=0)
    video_frames: int = Field(4, ge=1)
    """Frames per synthetic video, sent as Qwen's {"type": "video", "video": [frame URLs]} part."""

    @field_validator("modalities")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        if not v or any(w < 0 for w in v.values()) or sum(v.values()) <= 0:
            raise ValueError(f"modality weights must be >= 0 with a positive sum, got {v}")
        return v


@dataclass
class RequestSpec:
    """One request of the workload, fully built before the run so sending it costs no client work."""

    index: int
    content: list[dict[str, Any]] | None
    """The user turn's content parts; None when `messages` (from a dataset) is the whole conversation."""
    max_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)
    """What the request asks for (modality, images, sizes, prompt words...), recorded per request."""
    messages: list[dict[str, Any]] | None = None
    timestamp: float | None = None
    """Arrival offset from a recorded trace (dataset `timestamp`), used by --request-rate trace."""

    def chat_messages(self) -> list[dict[str, Any]]:
        return self.messages if self.messages is not None else [{"role": "user", "content": self.content}]


def parse_modalities(text: str) -> dict[str, float]:
    """"image" or "image:0.8,text:0.2"."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition(":")
        if name not in ("text", "image", "video", "audio"):
            raise WorkloadError(f"--modality {text!r}: unknown modality {name!r}; use text, image, video or audio")
        try:
            out[name] = float(weight) if weight else 1.0
        except ValueError:
            raise WorkloadError(f"--modality {text!r}: weight {weight!r} is not a number") from None
    if not out or sum(out.values()) <= 0 or any(w < 0 for w in out.values()):
        raise WorkloadError(f"--modality {text!r}: give at least one modality with a positive weight")
    return out


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """"336x336" or "224x224,640x480"."""
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)[xX](\d+)", part)
        if not m or min(int(m.group(1)), int(m.group(2))) < 1:
            raise WorkloadError(f"--image-size {text!r}: write WIDTHxHEIGHT[,WIDTHxHEIGHT...], e.g. 336x336")
        sizes.append((int(m.group(1)), int(m.group(2))))
    if not sizes:
        raise WorkloadError("--image-size is empty; write e.g. 336x336")
    return sizes


def prompt_text(rng: np.random.Generator, words: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=max(1, words)))


def synthesize(n: int, mix: MixConfig, seed: int) -> list[RequestSpec]:
    """n requests drawn from `mix` with a generator seeded by `seed` (the same seed, the same bytes)."""
    rng = np.random.default_rng([seed, 1])  # a stream apart from the arrival gaps' (seed, 0)
    names = list(mix.modalities)
    weights = np.array([mix.modalities[k] for k in names], dtype=float)
    kinds = rng.choice(len(names), size=n, p=weights / weights.sum())
    n_images = mix.images_per_request.sample(rng, n)
    prompts, outputs = mix.prompt_tokens.sample(rng, n), mix.output_tokens.sample(rng, n)
    specs = []
    for i in range(n):
        modality = names[int(kinds[i])]
        parts: list[dict[str, Any]] = []
        meta: dict[str, Any] = {"modality": modality, "prompt_words": int(prompts[i])}
        if modality == "image":
            sizes = [mix.image_sizes[int(j)] for j in rng.integers(0, len(mix.image_sizes), int(n_images[i]))]
            meta |= {"images": len(sizes), "image_sizes": [f"{w}x{h}" for w, h in sizes]}
            parts += [{"type": "image_url", "image_url": {"url": data_url(synthetic_image(rng, w, h), "image/jpeg")}}
                      for w, h in sizes]
        elif modality == "video":
            w, h = mix.image_sizes[int(rng.integers(0, len(mix.image_sizes)))]
            meta |= {"frames": mix.video_frames, "frame_size": f"{w}x{h}"}
            parts.append({"type": "video", "video": [data_url(synthetic_image(rng, w, h), "image/jpeg")
                                                     for _ in range(mix.video_frames)]})
        elif modality == "audio":
            wav = synthetic_wav(rng, mix.audio_seconds)
            meta["audio_s"] = mix.audio_seconds
            parts.append({"type": "input_audio", "input_audio": {"data": data_url(wav, "audio/wav").split(",", 1)[1],
                                                                 "format": "wav"}})
        parts.append({"type": "text", "text": prompt_text(rng, int(prompts[i]))})
        specs.append(RequestSpec(index=i, content=parts, max_tokens=int(outputs[i]), meta=meta))
    return specs
