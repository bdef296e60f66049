"""The three stress workloads of `tierserve profile` (HAS stage 1), each on one isolated worker.

- Encode: bursts of B one-image requests released as ONE micro-batch (fixed_timeout policy with
  max_batch = B, set through the admin endpoint), B doubling until throughput saturates (C_E). The
  answer's encode_batch proves the batch was B; a smaller one means the worker's own cap split it.
- Prefill: text-only requests (they skip the encoder) one at a time, per prompt length.
- Decode: B requests that must share every engine step, so each step decodes exactly B sequences.
  A burst of HTTP requests reaches the LLM worker over tens of milliseconds, longer than a step, so
  the burst is sent behind a gate: one long prompt, then two that fill a second step's token budget.
  Burst requests arriving during those steps cannot join them and are all admitted in the step after.
  A burst is kept only if it was clean: the same prefill_s and decode_s on every answer (the engine
  charges each request the wall time of the steps it was in, so equal sums mean the same steps).

Every sample keeps the worker's compute time (what ServiceTimes models) and the wall time around it
read from the hop marks (what ProfileOverheads models). A fourth phase, what a request joining a running
batch costs it, is profiling_admission.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.live_http import (
    Answer,
    LiveClusterError,
    PromptSizer,
    ask,
    chat_body,
    put_policy,
)
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest

Tick = Callable[[int], None]
"""Progress callback: this many planned measurements are done (or skipped)."""


class ProfileSettings(BaseModel):
    """What `tierserve profile` measures, and how hard."""

    model_config = ConfigDict(frozen=True)

    max_encode_batch: int = Field(64, ge=1)
    """Largest B tried while doubling (the encode worker's own cap, 8 by default, may stop it earlier)."""
    saturation_gain: float = Field(1.05, gt=1)
    """Doubling B stops once it raises encoder throughput by less than this factor (HAS's C_E rule)."""
    prompt_lengths: tuple[int, ...] = (32, 128, 512, 1024, 2000)
    """Prompt tokens of the prefill measurements (each below the model's context)."""
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Sequences per decode burst (at most the LLM worker's --max-num-seqs)."""
    decode_prompts: tuple[int, ...] = (32, 512)
    """Prompt tokens per sequence of the decode bursts (cut to step_token_budget / batch)."""
    decode_output_tokens: int = Field(32, ge=2)
    """Tokens each decode-burst request generates (the steps measured are one fewer)."""
    repeats: int = Field(3, ge=1)
    """Measurements per point; the median is kept."""
    retries: int = Field(3, ge=0)
    """Extra tries for a burst that came out unclean (split batch, staggered steps)."""
    warmup: int = Field(3, ge=0)
    """Unmeasured requests first (lazy imports, allocator warm-up)."""
    step_token_budget: int = Field(4096, ge=64)
    """The LLM worker's --max-num-batched-tokens (llm_node's default: max(4096, context))."""
    gate_prompt_tokens: int = Field(2000, ge=16)
    """Prompt tokens of the decode gate's first request: a long step the burst starts arriving in."""
    max_prompt_tokens: int = Field(2040, ge=16)
    """The longest prompt the model takes with one output token (its context - 1); the gate's second
    step uses two prompts of up to this size to fill the step budget."""
    gate_lead_s: float = Field(0.01, ge=0)
    """Pause between sending the gate's parts and the burst, so they reach the worker in that order."""
    burst_window_s: float = Field(2.0, gt=0)
    """fixed_timeout during encode bursts: a burst's B requests must all arrive within it."""
    pause_s: float = Field(0.1, ge=0)
    """Idle time before each encode burst and each prefill request. Requests arriving now and then find
    the processes asleep, and waking each hop costs milliseconds on a busy host: back-to-back requests
    would measure a latency only a saturated cluster sees."""
    encode_words: int = Field(4, ge=0)
    """Filler words beside the image in encode bursts (the prefill that follows stays small)."""
    admission_batch: int = Field(2, ge=1)
    """Decoders per burst of the admission phase (profiling_admission.py)."""
    admission_output_tokens: int = Field(96, ge=8)
    """Tokens each of them generates: long enough that the joins land while they decode."""
    admission_joins: int = Field(2, ge=1)
    """One-image requests sent into each joined burst, evenly over the lone burst's duration."""
    stack_requests: int = Field(10, ge=1)
    """Streaming requests per output length when measuring the serving stack's CPU (local clusters)."""
    stack_idle_s: float = Field(1.0, gt=0)
    """Idle interval whose CPU burn is subtracted from the stack's measurement."""
    timeout_s: float = Field(120.0, gt=0)
    """Per HTTP request."""


@dataclass(frozen=True)
class EncodeSample:
    """One burst encoded as one micro-batch."""

    batch: int
    """Requests (images) in the micro-batch."""
    seconds: float
    """The encoder call's wall time (compute)."""
    cycle_s: float
    """Encode-worker busy time for the batch: dequeued -> the last embeddings sent."""
    hop_s: float
    """Median over the batch of embeddings sent -> prefill job admitted."""
    latency_s: float
    """Client time outside the workers' busy spans. At B = 1: the TTFT of a streaming twin that goes on
    decoding (its first token is published while the next step computes, as in service) minus the twin's
    own dequeued -> first token; otherwise the round trip minus that span."""
    in_s: float | None = None
    """At B = 1: the twin's coordinator received -> encode worker dequeued (the way in of latency_s)."""


@dataclass(frozen=True)
class PrefillSample:
    """One prompt prefilled alone."""

    tokens: int
    """Prompt tokens."""
    seconds: float
    """Engine step wall time (compute)."""
    overhead_s: float
    """admitted -> first token, minus the step: the loop around it."""


@dataclass(frozen=True)
class DecodeSample:
    """One clean decode burst."""

    batch: int
    """Sequences in every decode step of the burst."""
    prompt_tokens: int
    """Prompt tokens per sequence."""
    output_tokens: int
    """Tokens per sequence (steps = this - 1)."""
    step_s: float
    """Mean engine step wall time (compute)."""
    cadence_s: float
    """Mean time between token publications at the worker (first token -> finished over the steps)."""

    @property
    def context_tokens(self) -> int:
        """KV tokens over the batch at the mean decode step (prompt + 1 at the first, + n - 1 at the last)."""
        return round(self.batch * (self.prompt_tokens + self.output_tokens / 2))


@dataclass
class EncodeResult:
    """The encode phase's clean bursts, and why doubling stopped if not for saturation."""

    samples: list[EncodeSample] = field(default_factory=list)
    capped_at: int | None = None
    """The encode worker split micro-batches above this size (its --max-batch-size)."""
    note: str | None = None
    """Why doubling stopped early, when not for saturation or the cap."""


def doublings(limit: int) -> list[int]:
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out


def median(xs: list[float]) -> float:
    if not xs:
        raise ValueError("median of no values")
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


async def encode_phase(client: httpx.AsyncClient, model: str, s: ProfileSettings, tick: Tick) -> EncodeResult:
    out = EncodeResult()
    best = 0.0
    batches = doublings(s.max_encode_batch)
    for i, b in enumerate(batches):
        await put_policy(client, {"batch": {"name": "fixed_timeout", "max_batch": b, "timeout_s": s.burst_window_s}})
        got: list[EncodeSample] = []
        for _ in range(s.repeats + s.retries):
            await asyncio.sleep(s.pause_s)
            answers = await asyncio.gather(*(ask(client, chat_body(model, s.encode_words, 1, 1)) for _ in range(b)))
            sizes = {a.compute["encode_batch"] for a in answers}
            if max(sizes) < b and len(sizes) == 1 and b > 1:
                out.capped_at = max(sizes)
                break
            if sizes == {b}:
                got.append(_encode_sample(b, answers, await _streamed_ttft(client, model, s) if b == 1 else None))
                tick(1)
                if len(got) == s.repeats:
                    break
        if out.capped_at is not None or not got:
            if not got and out.capped_at is None:
                out.note = (f"no clean micro-batch of {b} in {s.repeats + s.retries} bursts; doubling stopped "
                            f"(do all {b} requests reach the coordinator within burst_window_s={s.burst_window_s}?)")
            tick(s.repeats * (len(batches) - i) - len(got))
            break
        out.samples += got
        rate = b / median([g.seconds for g in got])
        if best and rate < best * s.saturation_gain:
            tick(s.repeats * (len(batches) - i - 1))
            break
        best = max(best, rate)
    return out


def _encode_sample(b: int, answers: list[Answer],
                   streamed: tuple[float, float | None, float | None] | None) -> EncodeSample:
    first = answers[0]
    busy = median([a.span("encode_dequeued", "first_token") for a in answers])
    way_in = None
    if streamed is not None:  # the twin's TTFT less its own busy span (another request's would add its noise)
        ttft, twin_busy, way_in = streamed
        latency = ttft - (twin_busy if twin_busy is not None else busy)
    else:
        latency = median([a.client_s for a in answers]) - busy
    return EncodeSample(
        batch=b, seconds=first.compute["encode_s"],
        cycle_s=max(a.span("encode_dequeued", "embeddings_sent") for a in answers),
        hop_s=median([a.span("embeddings_sent", "admitted") for a in answers]),
        latency_s=latency, in_s=way_in)


async def _streamed_ttft(client: httpx.AsyncClient, model: str,
                         s: ProfileSettings) -> tuple[float, float | None, float | None]:
    """A streaming request shaped like the encode probes, generating decode_output_tokens: its client TTFT,
    its own encode_dequeued -> first_token span and its way in (received -> encode_dequeued) from the
    usage chunk's marks (None when absent)."""
    await asyncio.sleep(s.pause_s)
    n = s.decode_output_tokens
    record = ReplayRecord(SimRequest(0, 0.0, "image", 1, 1, s.encode_words, n))
    await stream_request(client, record, chat_body(model, s.encode_words, 1, n, stream=True), time.perf_counter(), 0.0)
    if record.error is not None:
        raise LiveClusterError(f"a streaming request failed while timing the request latency: {record.error}")
    m = record.marks
    busy = m["first_token"] - m["encode_dequeued"] if {"first_token", "encode_dequeued"} <= m.keys() else None
    return record.ttft, busy, m.get("encode_dequeued")


async def prefill_phase(client: httpx.AsyncClient, model: str, sizer: PromptSizer, s: ProfileSettings,
                        tick: Tick) -> list[PrefillSample]:
    """Round robin over the lengths, `repeats` rounds: a burst of load from outside then touches one
    sample of many points rather than every sample of one."""
    out = []
    bodies = [chat_body(model, sizer.words_for(tokens, 0), 0, 1) for tokens in s.prompt_lengths]
    for _ in range(s.repeats):
        for body in bodies:
            await asyncio.sleep(s.pause_s)
            a = await ask(client, body)
            step = a.compute["prefill_s"]
            out.append(PrefillSample(a.prompt_tokens, step, a.span("admitted", "first_token") - step))
            tick(1)
    return out


async def decode_phase(client: httpx.AsyncClient, model: str, sizer: PromptSizer, s: ProfileSettings,
                       tick: Tick) -> tuple[list[DecodeSample], list[str]]:
    """Clean bursts per (batch, prompt), round robin like the prefill phase; also what was skipped."""
    out: list[DecodeSample] = []
    n = s.decode_output_tokens
    points = [(b, min(prompt, s.step_token_budget // b)) for b in s.decode_batches for prompt in s.decode_prompts]
    got, tries = dict.fromkeys(points, 0), dict.fromkeys(points, 0)
    for round_ in range(s.repeats):
        for point in points:
            b, fitted = point
            while got[point] <= round_ and tries[point] < s.repeats + s.retries:
                tries[point] += 1
                answers = await _gated_burst(client, model, sizer, s, sizer.words_for(fitted, 0), n, b)
                clean = (len({a.compute["prefill_s"] for a in answers}) == 1
                         and len({a.compute["decode_s"] for a in answers}) == 1
                         and all(a.completion_tokens == n for a in answers))
                if clean:
                    a = answers[0]
                    out.append(DecodeSample(b, a.prompt_tokens, n, a.compute["decode_s"] / (n - 1),
                                            a.span("first_token", "finished") / (n - 1)))
                    got[point] += 1
                    tick(1)
    tick(sum(s.repeats - k for k in got.values()))
    skipped = [f"decode batch {b} x {fitted} prompt tokens: no clean burst in {tries[(b, fitted)]} tries (is the LLM "
               f"worker's --max-num-seqs below {b}?)" for (b, fitted), k in got.items() if not k]
    return out, skipped


async def _gated_burst(client: httpx.AsyncClient, model: str, sizer: PromptSizer, s: ProfileSettings, words: int,
                       tokens: int, b: int) -> list[Answer]:
    """`b` requests of `words` filler words and `tokens` output tokens, sent behind the two-step gate."""
    # The second step's two prompts leave less budget than one burst prompt, so no burst request joins them.
    fill = min(s.max_prompt_tokens, -(-(s.step_token_budget - sizer.tokens(words, 0) + 1) // 2))
    parts = [asyncio.ensure_future(ask(client, chat_body(model, sizer.words_for(s.gate_prompt_tokens, 0), 0, 1)))]
    try:
        await asyncio.sleep(s.gate_lead_s)
        second = chat_body(model, sizer.words_for(fill, 0), 0, 1)
        parts += [asyncio.ensure_future(ask(client, second)) for _ in range(2)]
        await asyncio.sleep(s.gate_lead_s)
        body = chat_body(model, words, 0, tokens)
        return list(await asyncio.gather(*(ask(client, body) for _ in range(b))))
    finally:
        gate = await asyncio.gather(*parts, return_exceptions=True)  # never left running
        failed = [g for g in gate if isinstance(g, BaseException)]
        if failed:
            raise failed[0]
