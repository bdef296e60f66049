"""A streaming OpenAI chat-completions client that times each request and never raises.

Timing is taken at the client, as a user sees it (the server's own `tierserve` timings are not used,
so the same code measures any OpenAI-compatible server):
  TTFT  send -> first chunk with non-empty `delta.content` (role-only chunks do not count)
  E2E   send -> end of the stream
  TPOT  (E2E - TTFT) / (output tokens - 1); none for a 1-token answer
  ITL   gaps between successive content chunks (a chunk may carry several tokens)
Output tokens come from the stream's `usage` chunk (we ask for it with stream_options.include_usage);
servers that send none are counted by content chunks instead.

Every failure becomes an `error_type` on the record (connect_error, timeout, http_4xx/5xx by status,
stream_error, bad_response, no_tokens, read_error...) so a run finishes and reports what went wrong.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.bench.workload import RequestSpec


@dataclass
class RequestRecord:
    """One request's outcome; times in seconds, offsets relative to its cell's start."""

    index: int
    scheduled_s: float
    """When the arrival process said to send it."""
    sent_s: float | None = None
    """When it was sent (later than scheduled only under --max-concurrency)."""
    ok: bool = False
    error_type: str | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    good: bool = False
    """Completed and met the SLO (set by the summary)."""
    request: dict[str, Any] = field(default_factory=dict)
    """What was asked (modality, images, sizes, prompt words, max_tokens)."""


@dataclass(frozen=True)
class ClientOptions:
    model: str
    ignore_eos: bool = True
    """vLLM's extension (tierserve honours it): generate exactly max_tokens, so systems do equal work."""
    timeout_s: float = 300.0
    headers: dict[str, str] = field(default_factory=dict)


def timings(t_send: float, stamps: list[float], t_end: float, output_tokens: int) -> dict[str, Any]:
    """TTFT, E2E, TPOT and ITL from the send time, content-chunk arrival times and stream end."""
    ttft = stamps[0] - t_send
    e2e = t_end - t_send
    return {"ttft_s": ttft, "e2e_s": e2e,
            "tpot_s": (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else None,
            "itl_s": [b - a for a, b in itertools.pairwise(stamps)]}


def _error_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
    except (ValueError, AttributeError):
        pass
    return body.decode(errors="replace")[:300]


def request_body(spec: RequestSpec, opts: ClientOptions) -> dict[str, Any]:
    body: dict[str, Any] = {"model": opts.model, "messages": spec.chat_messages(), "max_tokens": spec.max_tokens,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if opts.ignore_eos:
        body["ignore_eos"] = True
    return body


async def send(client: httpx.AsyncClient, spec: RequestSpec, opts: ClientOptions, rec: RequestRecord,
               clock_zero: float) -> RequestRecord:
    """Send `spec`, stream the answer, and fill `rec`; every exception is recorded, none escapes."""
    rec.request = dict(spec.meta, max_tokens=spec.max_tokens)
    body = request_body(spec, opts)
    t_send = time.perf_counter()
    rec.sent_s = t_send - clock_zero
    try:
        await _stream(client, body, opts, rec, t_send)
    except httpx.ConnectError as e:
        rec.error_type, rec.error = "connect_error", str(e)[:300]
    except httpx.TimeoutException as e:
        rec.error_type, rec.error = "timeout", f"{type(e).__name__} after {time.perf_counter() - t_send:.1f} s"
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        rec.error_type, rec.error = "read_error", f"{type(e).__name__}: {e}"[:300]
    except httpx.HTTPError as e:
        rec.error_type, rec.error = "http_error", f"{type(e).__name__}: {e}"[:300]
    except Exception as e:  # noqa: BLE001 - a benchmark counts failures; it does not die of them
        rec.error_type, rec.error = f"client_error:{type(e).__name__}", str(e)[:300]
    rec.ok = rec.error_type is None
    return rec


async def _stream(client: httpx.AsyncClient, body: dict, opts: ClientOptions, rec: RequestRecord, t_send: float) -> None:
    stamps: list[float] = []
    usage_tokens: int | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=opts.headers,
                             timeout=opts.timeout_s) as r:
        if r.status_code != 200:
            rec.error_type, rec.error = f"http_{r.status_code}", _error_message(await r.aread())
            return
        ctype = r.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            rec.error_type = "bad_response"
            rec.error = f"expected a text/event-stream answer to a stream:true request, got {ctype or 'no content-type'}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event: lines
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                rec.error_type, rec.error = "bad_response", f"stream line is not JSON: {data[:120]!r}"
                return
            if not isinstance(chunk, dict):
                rec.error_type, rec.error = "bad_response", f"stream chunk is not an object: {data[:120]!r}"
                return
            if chunk.get("error"):
                err = chunk["error"]
                rec.error_type = "stream_error"
                rec.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                return
            if not isinstance(chunk.get("choices"), list):
                rec.error_type, rec.error = "bad_response", f"chunk has no `choices` list: {data[:120]!r}"
                return
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                usage_tokens = usage.get("completion_tokens", usage_tokens)
                rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
            if any(isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in chunk["choices"]):
                stamps.append(time.perf_counter())
    t_end = time.perf_counter()
    if not stamps:
        rec.error_type, rec.error = "no_tokens", "the stream ended without any content"
        return
    rec.output_tokens = int(usage_tokens) if usage_tokens else len(stamps)
    for k, v in timings(t_send, stamps, t_end, rec.output_tokens).items():
        setattr(rec, k, v)
