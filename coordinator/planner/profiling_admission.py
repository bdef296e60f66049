"""What admitting a request costs the sequences an LLM worker is already decoding (`tierserve profile`'s
admission phase).

A request joining a running batch is received (its embeddings or KV cache read off the transfer), added to
the engine and prefilled; its prefill shares a step with the batch's decodes (that step's compute is in
every decoder's decode_s), but the rest runs between steps, on the worker's core and under its Python lock,
and holds back every sequence in the batch. The decode phase never sees it: its bursts are admitted
together, before the steps it times.

Measured as a difference, per repeat: a burst of `admission_batch` text-only decoders alone, then the same
burst with `admission_joins` one-image requests sent while it decodes. Per decoder the time between steps
is (first token -> finished) - decode_s (its steps' compute); the joined burst's mean less the lone
burst's, over the joins admitted while every decoder was still decoding, is the admission's cost to the
batch (ProfileOverheads.admit_s). A repeat whose joins did not all land inside the burst is retried.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from coordinator.planner.live_http import Answer, PromptSizer, ask, chat_body
from coordinator.planner.profiling_phases import ProfileSettings, Tick, median


@dataclass(frozen=True)
class AdmissionSample:
    """One burst alone and the same burst joined by other requests."""

    joins: int
    """Requests admitted while every decoder of the burst was decoding."""
    gap_alone_s: float
    """Mean over the lone burst's decoders of (first token -> finished) - decode_s: time between steps."""
    gap_joined_s: float
    """The same for the joined burst."""

    @property
    def admit_s(self) -> float:
        """The time between steps each join added to the batch (0 when the difference is noise below it)."""
        return max(0.0, (self.gap_joined_s - self.gap_alone_s) / self.joins)


@dataclass(frozen=True)
class _Timed:
    answer: Answer
    sent: float
    """perf_counter at send."""
    done: float
    """perf_counter when the answer was in."""


async def _timed(client: httpx.AsyncClient, body: dict, delay_s: float = 0.0) -> _Timed:
    await asyncio.sleep(delay_s)
    sent = time.perf_counter()
    answer = await ask(client, body)
    return _Timed(answer, sent, time.perf_counter())


def _gap(answers: list[Answer]) -> float:
    return sum(a.span("first_token", "finished") - a.compute["decode_s"] for a in answers) / len(answers)


async def admission_phase(client: httpx.AsyncClient, model: str, sizer: PromptSizer, s: ProfileSettings,
                          tick: Tick) -> list[AdmissionSample]:
    """`s.repeats` clean samples (fewer if `s.retries` extra tries do not give them)."""
    out: list[AdmissionSample] = []
    member = chat_body(model, sizer.words_for(32, 0), 0, s.admission_output_tokens)
    joiner = chat_body(model, s.encode_words, 1, 2)
    for _ in range(s.repeats + s.retries):
        if len(out) == s.repeats:
            break
        await asyncio.sleep(s.pause_s)
        alone = await asyncio.gather(*(_timed(client, member) for _ in range(s.admission_batch)))
        span = min(t.done for t in alone) - max(t.sent for t in alone)
        await asyncio.sleep(s.pause_s)
        start = time.perf_counter()
        members = [asyncio.ensure_future(_timed(client, member)) for _ in range(s.admission_batch)]
        joins = [asyncio.ensure_future(_timed(client, joiner, span * (i + 1) / (s.admission_joins + 1)))
                 for i in range(s.admission_joins)]
        joined, joiners = await asyncio.gather(*members), await asyncio.gather(*joins)
        decoding_from = max(t.sent + t.answer.marks["first_token"] for t in joined)
        decoding_to = min(t.done for t in joined)
        inside = [j for j in joiners if j.sent >= max(start, decoding_from) and j.done <= decoding_to]
        if len(inside) == s.admission_joins:
            out.append(AdmissionSample(len(inside), _gap([t.answer for t in alone]), _gap([t.answer for t in joined])))
            tick(1)
    tick(s.repeats - len(out))
    return out


def admit_s(samples: list[AdmissionSample]) -> float:
    """The median admission cost over the samples (0 for none)."""
    return median([x.admit_s for x in samples]) if samples else 0.0
