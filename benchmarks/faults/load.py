"""A steady load of streaming image requests, each answer checked against the one the same request got
with no fault (greedy decoding is deterministic), and every request classified:

  served   200, the stream ended with a finish reason, and its text is the expected one
  errored  an explicit error (an HTTP 4xx/5xx with OpenAI's error body, or an SSE error event) within
           `error_bound_s` of sending
  wrong    served, but its text differs from the expected one (a repeated or a missing token)
  lost     anything else: a dropped connection, a stream that ended without a finish, a late error
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

import numpy as np

from benchmarks.bench.media import data_url, synthetic_image

MAX_TOKENS = 16


@dataclass
class Outcome:
    kind: str
    sent_at: float
    """time.monotonic() when sent."""
    latency_s: float
    detail: str = ""
    reruns: int = 0
    first_token_s: float | None = None
    """Seconds from sending to the first streamed text (the first non-empty chunk), None if none came."""
    max_gap_s: float = 0.0
    """The longest wait between two streamed text chunks (a stall mid-answer, e.g. a hand-off to a dead worker)."""


def image_url(image: int) -> str:
    return data_url(synthetic_image(np.random.default_rng(image), 64, 64, "PNG"), "image/png")


def request_body(model: str, image: int, stream: bool = True, max_tokens: int = MAX_TOKENS) -> dict:
    return {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_url(image)}},
                {"type": "text", "text": f"picture {image}: what is in it?"}]}]}


async def send(client: httpx.AsyncClient, url: str, body: dict, timeout_s: float,
               text_times: list[float] | None = None) -> tuple[int, str, str | None, int]:
    """(HTTP status, streamed text, error message or None, re-runs) of one streaming request; the
    time.monotonic() of every non-empty text chunk is appended to `text_times` when given."""
    text, error, reruns, finished = [], None, 0, False
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s) as r:
        if r.status_code != 200:
            raw = await r.aread()
            try:
                return r.status_code, "", json.loads(raw)["error"]["message"], 0
            except (ValueError, KeyError, TypeError):
                return r.status_code, "", None, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"].get("message") or "error"
                continue
            for choice in chunk.get("choices") or []:
                text.append(choice.get("delta", {}).get("content") or "")
                if text_times is not None and text[-1]:
                    text_times.append(time.monotonic())
                finished = finished or choice.get("finish_reason") is not None
            reruns = (chunk.get("tierserve") or {}).get("reruns", reruns)
    if error is None and not finished:
        error = "__no_finish__"
    return 200, "".join(text), error, reruns


async def classify(client: httpx.AsyncClient, url: str, body: dict, expected: str | None, timeout_s: float,
                   error_bound_s: float) -> Outcome:
    t0, times = time.monotonic(), []
    try:
        status, text, error, reruns = await send(client, url, body, timeout_s, times)
    except (httpx.HTTPError, ValueError) as e:
        return Outcome("lost", t0, time.monotonic() - t0, f"{type(e).__name__}: {e}")
    took = time.monotonic() - t0
    if status == 200 and error is None:
        if expected is not None and text != expected:
            return Outcome("wrong", t0, took, f"got {text!r}, expected {expected!r}", reruns)
        return Outcome("served", t0, took, "", reruns, times[0] - t0 if times else None,
                       max((b - a for a, b in zip(times, times[1:])), default=0.0))
    if error in (None, "__no_finish__"):
        return Outcome("lost", t0, took, f"HTTP {status} without an error body" if status != 200
                       else "stream ended without a finish reason")
    if took > error_bound_s:
        return Outcome("lost", t0, took, f"explicit error only after {took:.1f} s: {error}")
    return Outcome("errored", t0, took, f"HTTP {status}: {error}")


@dataclass
class SteadyLoad:
    """Open-loop arrivals at `rate` req/s over `images` distinct requests, until `stop` (bounded)."""

    url: str
    model: str
    expected: dict[int, str]
    """image index -> the answer it got with no fault."""
    rate: float = 2.0
    max_tokens: int = MAX_TOKENS
    timeout_s: float = 60.0
    error_bound_s: float = 5.0
    outcomes: list[Outcome] = field(default_factory=list)

    async def run(self, stop: asyncio.Event, max_requests: int = 100_000) -> list[Outcome]:
        images = sorted(self.expected)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=httpx.Limits(max_connections=512)) as client:
            tasks: list[asyncio.Task] = []
            start = time.monotonic()
            for n in range(max_requests):
                if stop.is_set():
                    break
                image = images[n % len(images)]
                body = request_body(self.model, image, max_tokens=self.max_tokens)
                tasks.append(asyncio.create_task(classify(client, self.url, body, self.expected[image],
                                                          self.timeout_s, self.error_bound_s)))
                delay = start + (n + 1) / self.rate - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
            self.outcomes = list(await asyncio.gather(*tasks))
        return self.outcomes


async def expected_answers(url: str, model: str, images: list[int], max_tokens: int = MAX_TOKENS,
                           timeout_s: float = 120.0) -> dict[int, str]:
    """Each image's answer with no fault (the reference a faulted run must reproduce)."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        out = {}
        for image in images:
            status, text, error, _ = await send(client, url, request_body(model, image, max_tokens=max_tokens),
                                                timeout_s)
            if status != 200 or error is not None:
                raise RuntimeError(f"reference request for image {image} failed: HTTP {status} {error}")
            out[image] = text
        return out


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    c = Counter(o.kind for o in outcomes)
    return {k: c.get(k, 0) for k in ("served", "errored", "wrong", "lost")} | {
        "sent": len(outcomes), "rerun": sum(1 for o in outcomes if o.reruns)}


async def serves_again_within(url: str, model: str, image: int, expected: str, since: float, limit_s: float,
                              max_tokens: int = MAX_TOKENS, probe_every_s: float = 0.25) -> float | None:
    """Seconds from `since` (monotonic) until the cluster serves again: a fresh request's first token, counted
    only when that request's whole answer then comes out right and never stalled longer than `limit_s` between
    two chunks (its later tokens may come from a worker that is dead and not yet detected); None if no probe
    did so within `limit_s`. The first token, not the last, since how long a long answer takes to stream is
    decode speed, not recovery. A probe sent within `limit_s` whose first token came later returns that later
    time (the caller judges it)."""
    timeout_s = limit_s + 15.0
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        while time.monotonic() - since < limit_s:
            o = await classify(client, url, request_body(model, image, max_tokens=max_tokens), expected,
                               timeout_s, timeout_s)
            if o.kind == "served" and o.first_token_s is not None and o.max_gap_s <= limit_s:
                return o.sent_at + o.first_token_s - since
            await asyncio.sleep(probe_every_s)
    return None
