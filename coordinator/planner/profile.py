"""Measured service times of one model on one tier, and the piecewise-linear reading of them.

`tierserve profile` measures these on real workers (HAS stage 1: encode per batch size, prefill per
prompt length, decode per batch and context) and saves them as JSON; the performance model prefers
them to its roofline estimate. Between measured points times are interpolated linearly; beyond them
they are extrapolated along the nearest segment, because service times grow about linearly in tokens
once the GPU is busy. No reading is ever negative.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coordinator.planner.service import Modality


def interpolate(points: Iterable[tuple[float, float]], x: float) -> float:
    """y at x on the polyline through `points` (repeated x are averaged), extended linearly at both
    ends; a single point gives a constant. Clamped at 0."""
    groups: dict[float, list[float]] = defaultdict(list)
    for px, py in points:
        groups[float(px)].append(float(py))
    if not groups:
        raise ValueError("interpolate needs at least one measured point")
    xs = sorted(groups)
    ys = [sum(groups[k]) / len(groups[k]) for k in xs]
    if len(xs) == 1:
        return max(0.0, ys[0])
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


class EncodePoint(BaseModel):
    """One encoder forward over a batch."""

    model_config = ConfigDict(frozen=True)

    batch: int = Field(ge=1)
    """Items in the batch."""
    seconds: float = Field(ge=0)
    """Wall time of the encoder call over the batch, as the worker reports it (`tierserve profile`
    records Encoder.encode, which on the CPU tier decodes and preprocesses the images inline)."""


class EncodeCurve(BaseModel):
    """Encoder times per batch size, measured with items of one size."""

    model_config = ConfigDict(frozen=True)

    tokens_per_item: int = Field(ge=1)
    """Embedding tokens each measured item produced. A query with other items is read at the batch
    holding the same total tokens (encoder time taken as a function of batch * tokens_per_item)."""
    points: tuple[EncodePoint, ...] = Field(min_length=1)
    """The measurements."""


class PrefillPoint(BaseModel):
    """One prefill forward."""

    model_config = ConfigDict(frozen=True)

    tokens: int = Field(ge=1)
    """Prompt tokens in the forward, summed over the sequences batched together."""
    seconds: float = Field(ge=0)
    """Wall time of the forward."""


class DecodePoint(BaseModel):
    """One decode step."""

    model_config = ConfigDict(frozen=True)

    batch: int = Field(ge=1)
    """Sequences advanced by the step."""
    context_tokens: int = Field(ge=0)
    """Tokens in their KV caches, summed over the batch (as ServiceTimes.decode_step_s takes it)."""
    seconds: float = Field(ge=0)
    """Wall time of the step."""


class ProfileOverheads(BaseModel):
    """What the serving stack adds around the compute the points above time, measured on the same cluster.

    The points are the workers' own compute timings (encoder call, engine step); a live request also
    pays the hops around them. Busy-time overheads lengthen a worker's service time (PerfModel adds
    them to encode_s / prefill_s / decode_step_s); latencies delay a request without occupying a worker.
    """

    model_config = ConfigDict(frozen=True)

    encode_batch_s: float = Field(0.0, ge=0)
    """Encode-worker busy seconds per micro-batch outside the encoder call (media fetch, GPU claim,
    routing), the intercept of a line fitted over batch sizes."""
    encode_request_s: float = Field(0.0, ge=0)
    """Encode-worker busy seconds per request of a batch outside the encoder call (sending its
    embeddings, pushing its prefill job): the slope of that line."""
    prefill_step_s: float = Field(0.0, ge=0)
    """LLM-worker seconds around a prefill-only step beyond its compute (admission, the thread hop,
    publishing): it includes the loop's per-step part, which PerfModel counts once per step."""
    decode_step_s: float = Field(0.0, ge=0)
    """LLM-worker seconds per decode step beyond its compute (the engine loop, publishing tokens): intercept."""
    decode_seq_s: float = Field(0.0, ge=0)
    """The same, per sequence in the step (one token event each): slope."""
    hop_s: float = Field(0.0, ge=0)
    """Latency of one hand-over between workers (embeddings sent -> prefill job admitted), used as the
    transfer latency to this tier's workers."""
    request_latency_s: float = Field(0.0, ge=0)
    """Latency every request pays outside any worker (HTTP, tokenization, media store, dispatch,
    relaying the first token to the client): an idle cluster's streaming TTFT minus the workers' busy
    time, for a request that goes on decoding (its first token is published while the next step runs)."""
    request_in_s: float | None = Field(None, ge=0)
    """Of request_latency_s, the way in: the coordinator received the request -> the encode worker dequeued
    it (the twin's own marks). The rest is the way out (the first token -> the client) plus the request's
    way to the coordinator, as ttft_stages cuts them. None: not measured (profiles before 2026-12-02)."""
    stack_cpu_request_s: float = Field(0.0, ge=0)
    """CPU seconds the serving stack outside the workers (coordinator, Redis, and the load generator
    when it runs on the same host) spends per streamed request, beyond its tokens."""
    stack_cpu_token_s: float = Field(0.0, ge=0)
    """The same per streamed output token (relaying it, parsing its chunk)."""
    admit_s: float = Field(0.0, ge=0)
    """LLM-worker seconds between steps per request admitted to a running batch (receiving its tensors, adding
    it to the engine, publishing its first token), which every sequence in the batch waits through: the admission
    phase (profiling_admission.py). 0: not measured (profiles before 2026-12-06)."""
    kv_hop_s: float | None = Field(None, ge=0)
    """Latency of one KV hand-off from a prefill worker to a decode worker (its first token -> the decode worker
    admitted the request), the median at idle on a cluster with a prefill/decode pair (profiling_handoff.py).
    PerfModel reads it for KV transfers in place of hop_s, which times the embeddings' hand-over. None: not
    measured (a profiling cluster has no such pair; profiles before 2026-12-07): KV hand-offs take hop_s."""
    shared_cores: int = Field(0, ge=0)
    """Cores the workers share with that stack (the host's, on a one-host CPU cluster); 0: the stack
    runs elsewhere and takes nothing from the workers (no contention modelled)."""


class Stage1(BaseModel):
    """HAS stage 1's figures as measured (doubling B; stress workloads), for reports and sanity checks."""

    model_config = ConfigDict(frozen=True)

    encode_items_per_s: float = Field(ge=0)
    """Best encoder throughput seen while doubling B (C_E for one item per request)."""
    encode_batch: int = Field(ge=1)
    """The B that gave it."""
    encode_batch_capped: bool = False
    """Doubling stopped at the encode worker's own batch cap, not because throughput saturated."""
    prefill_tokens_per_s: float = Field(ge=0)
    """Best prefill throughput over the measured prompt lengths (C_P = this / prompt tokens)."""
    decode_tokens_per_s: float = Field(ge=0)
    """Best decode throughput (batch / step seconds) over the stress bursts (C_D = this / (output - 1))."""
    decode_batch: int = Field(ge=0)
    """The batch that gave it."""


def dominated_decode(points: Iterable[DecodePoint]) -> list[DecodePoint]:
    """Each point no slower than the fastest point with at least its sequences and its KV tokens: a
    decode step reads every weight and every cached key/value once, so more of both never makes it
    faster, and a point that is (a slow burst on a shared host) is an outlier. Median-pooled profiles
    keep them: in benchmarks/results/sim_fidelity_layouts.json the batch-1 x 48-token step was 6.3-7.5 ms
    in 6 of 16 profiles where the batch-2 x 96 step beside it took 2.9-3.5 ms (and 1.9-3.1 ms in the
    others), while the fastest tenth of live requests at 3 req/s (epd, stealing) took 3.8-4.4 ms a token."""
    pts = list(points)
    return [p.model_copy(update={"seconds": min(q.seconds for q in pts
                                                if q.batch >= p.batch and q.context_tokens >= p.context_tokens)})
            for p in pts]


class Profile(BaseModel):
    """Everything measured for one model on one tier."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tier: str
    """Catalog tier the worker ran on (canonical name or alias)."""
    model: str
    """ModelArch.name of the model measured; a profile is never applied to another model."""
    measured_at: str
    """When (ISO date or datetime), so a stale profile can be spotted."""
    source: str = ""
    """How: the command and host that produced it."""
    encode: dict[Modality, EncodeCurve] = {}
    """Encoder curves by modality; a missing modality falls back to the roofline estimate."""
    prefill: tuple[PrefillPoint, ...] = ()
    """Prefill measurements; empty falls back to the roofline estimate."""
    decode: tuple[DecodePoint, ...] = ()
    """Decode-step measurements; empty falls back to the roofline estimate."""
    overheads: ProfileOverheads | None = None
    """The serving stack's cost around the compute points; None: not measured (compute only)."""
    stage1: Stage1 | None = None
    """Capacities as measured; None for hand-written profiles."""

    @model_validator(mode="after")
    def _some_points(self) -> Profile:
        if not (self.encode or self.prefill or self.decode):
            raise ValueError(f"profile of {self.model!r} on {self.tier!r} has no measured points at all")
        return self

    def encode_s(self, modality: Modality, batch: int, tokens_per_item: int) -> float | None:
        curve = self.encode.get(modality)
        if curve is None:
            return None
        equivalent_batch = batch * tokens_per_item / curve.tokens_per_item
        return interpolate(((p.batch, p.seconds) for p in curve.points), equivalent_batch)

    def prefill_s(self, tokens: int) -> float | None:
        if not self.prefill:
            return None
        return interpolate(((p.tokens, p.seconds) for p in self.prefill), tokens)

    def prefill_batch_s(self, lengths: Sequence[int]) -> float | None:
        """One prefill step over sequences of these prompt lengths, each with its own causal attention: the
        longest at its measured time, every other at its time less the step's fixed part (prefill_fixed_s),
        which the step pays once. A batch is not one prompt of all its tokens: the points are single prompts,
        whose attention grows with the square of their length. The tiny LLaVA in-process (language model
        forward, one thread): 8 prompts of 315 tokens 75.4 ms, this model 75.3 ms; one prompt of 2520 tokens,
        the old reading, 167 ms."""
        if not self.prefill:
            return None
        times = sorted(interpolate(((p.tokens, p.seconds) for p in self.prefill), n) for n in lengths)
        fixed = self.prefill_fixed_s
        return times[-1] + sum(t - min(fixed, t) for t in times[:-1]) if times else 0.0

    @cached_property
    def prefill_fixed_s(self) -> float:
        """The part of a prefill step that does not grow with its prompt: the measured points' line at 0
        tokens (through the two shortest), within [0, the shortest prompt's time]."""
        if not self.prefill:
            return 0.0
        shortest = min(self.prefill, key=lambda p: p.tokens)
        return min(shortest.seconds, interpolate(((p.tokens, p.seconds) for p in self.prefill), 0))

    def decode_step_s(self, batch: int, context_tokens: int) -> float | None:
        """Linear in context within each measured batch size, then linear across batch sizes, through
        the points as dominated_decode() bounds them."""
        if not self.decode:
            return None
        at_batch = ((b, interpolate(pts, context_tokens)) for b, pts in self._decode_rows.items())
        return interpolate(at_batch, batch)

    @cached_property
    def _decode_rows(self) -> dict[int, list[tuple[float, float]]]:
        """(context tokens, seconds) per batch size, bounded once (the simulator asks at every step)."""
        rows: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for p in dominated_decode(self.decode):
            rows[p.batch].append((p.context_tokens, p.seconds))
        return dict(rows)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        path = Path(path)
        try:
            return cls.model_validate_json(path.read_text())
        except OSError as exc:
            raise ValueError(f"cannot read profile {path}: {exc.strerror}") from None
        except ValidationError as exc:
            bad = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"profile {path} is invalid: {bad}. Re-run `tierserve profile` "
                             f"or fix the file") from None


def pool_profiles(profiles: Iterable[Profile], source: str = "") -> Profile:
    """One profile from several of the same model and tier (e.g. repeated `tierserve profile` runs on one
    cluster): at every measured point, and for every overhead, the median over the profiles that have
    it. A single profile is a noisy sample of a shared host: on benchmarks/results/sim_fidelity.json's
    host, three profiles taken minutes apart put the same decode steps 15-20 % apart, more than the
    load-dependence being simulated. stage1 is dropped (it describes one run); overheads are pooled
    only when every profile has them."""
    found = list(profiles)
    if not found:
        raise ValueError("pool_profiles needs at least one profile")
    first = found[0]
    odd = sorted({(p.model, p.tier) for p in found} - {(first.model, first.tier)})
    if odd:
        raise ValueError(f"profiles of {odd} cannot be pooled with {first.model!r} on {first.tier!r}")

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    def pooled(pairs: Iterable[tuple[object, float]]) -> list[tuple[object, float]]:
        groups: dict[object, list[float]] = defaultdict(list)
        for key, seconds in pairs:
            groups[key].append(seconds)
        return [(key, med(xs)) for key, xs in sorted(groups.items())]

    encode = {}
    for modality in sorted({m for p in found for m in p.encode}):
        curves = [p.encode[modality] for p in found if modality in p.encode]
        sizes = {c.tokens_per_item for c in curves}
        if len(sizes) > 1:
            raise ValueError(f"{modality} curves were measured with {sorted(sizes)} tokens per item; pool like with like")
        encode[modality] = EncodeCurve(tokens_per_item=sizes.pop(), points=tuple(
            EncodePoint(batch=b, seconds=x) for b, x in pooled((pt.batch, pt.seconds) for c in curves for pt in c.points)))
    prefill = tuple(PrefillPoint(tokens=t, seconds=x)
                    for t, x in pooled((pt.tokens, pt.seconds) for p in found for pt in p.prefill))
    decode = tuple(DecodePoint(batch=k[0], context_tokens=k[1], seconds=x) for k, x in pooled(
        ((pt.batch, pt.context_tokens), pt.seconds) for p in found for pt in p.decode))
    overheads = None
    if all(p.overheads is not None for p in found):
        fields = ProfileOverheads.model_fields
        optional = {}
        for name in ("request_in_s", "kv_hop_s"):  # pooled only when every profile measured it
            got = [getattr(p.overheads, name) for p in found if getattr(p.overheads, name) is not None]
            optional[name] = med(got) if len(got) == len(found) else None
        overheads = ProfileOverheads(**{name: med([getattr(p.overheads, name) for p in found]) for name in fields
                                        if name != "shared_cores" and name not in optional},
                                     shared_cores=max(p.overheads.shared_cores for p in found), **optional)
    return Profile(tier=first.tier, model=first.model, measured_at=max(p.measured_at for p in found),
                   source=source or f"median of {len(found)} profiles measured {', '.join(p.measured_at for p in found)}",
                   encode=encode, prefill=prefill, decode=decode, overheads=overheads)


def load_profiles(paths: Iterable[str | Path]) -> Mapping[str, Profile]:
    """Profiles from files, or from every *.json in a directory, keyed by their tier as written. Several
    of one tier (repeated `tierserve profile` runs) are pooled: one run is a noisy sample of a shared host
    (see pool_profiles)."""
    by_tier: dict[str, list[Profile]] = defaultdict(list)
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"no profile at {path}; write one with `tierserve profile --out {path}`")
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path} holds no *.json profile; write one with `tierserve profile --out {path}/<tier>.json`")
        for file in files:
            by_tier[(profile := Profile.load(file)).tier].append(profile)
    return {tier: found[0] if len(found) == 1 else pool_profiles(found) for tier, found in by_tier.items()}
