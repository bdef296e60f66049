"""`POST /v1/chat/completions`: validate, submit, relay tokens back (JSON or SSE)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from coordinator.api.logprobs import LogprobRenderer
from coordinator.api.schema import (
    AssistantMessage, ChatCompletion, ChatCompletionRequest, Choice, ChoiceLogprobs, Delta, ErrorResponse, StreamOptions,
    TextPart, Usage, completion_id, openai_finish_reason,
)
from coordinator.errors import RequestError
from coordinator.flights import Flight, RelayTimeout
from coordinator.prompt import sampling_from_request
from coordinator.protocol.logprobs import TokenLogprobs
from coordinator.protocol.messages import TokenEvent
from coordinator.protocol.process import cancel_and_wait
from coordinator.state import AppState, State
from coordinator.prompt_ahead import dispatch_ahead, media_ahead
from coordinator.submit import cleanup, inline_bytes, media_refs, store_and_dispatch

log = logging.getLogger(__name__)
router = APIRouter()


class Tracker:
    """Per-request latency bookkeeping: TTFT and TPOT at the coordinator, and overhead vs compute."""

    def __init__(self, state: AppState, request_id: str, prompt_tokens: int, t0: float):
        self.state, self.request_id, self.prompt_tokens = state, request_id, prompt_tokens
        self.t0 = t0
        """perf_counter() when the request arrived, before parsing: the overhead includes all of it."""
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.final: TokenEvent | None = None
        self.relayed = 0.0
        self.first_worker = ""
        """The worker that produced the first token: where the prefill ran."""
        self.flight: Flight | None = None

    def see(self, ev: TokenEvent) -> None:
        if ev.token_ids:
            now = time.perf_counter()
            if self.first is None:
                self.first_worker = ev.worker_id
            self.first = self.first or now
            self.last = now
            self.tokens += len(ev.token_ids)
        if ev.finish_reason is not None:
            self.final = ev
            self.relayed = time.time()

    def summary(self) -> dict:
        e2e = time.perf_counter() - self.t0
        ttft = (self.first - self.t0) if self.first else None
        tpot = (self.last - self.first) / (self.tokens - 1) if self.first and self.tokens > 1 else None
        timing = self.final.timing if self.final and self.final.timing else None
        compute = (timing.encode_s + timing.prefill_s + timing.decode_s) if timing else None
        return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "overhead_s": (e2e - compute) if compute is not None else None,
                "compute": timing.model_dump(exclude={"marks"}) if timing else None,
                "stages_s": stages(timing.marks, self.relayed) if timing else None, "prefill_worker": self.first_worker,
                "reruns": self.flight.attempt if self.flight else 0,
                "lost_workers": list(self.flight.lost_holders) if self.flight else []}

    def record(self, outcome: str) -> dict:
        m, s = self.state.metrics, self.summary()
        m.requests.labels(outcome).inc()
        m.tokens.inc(self.tokens)
        for hist, key in ((m.ttft, "ttft_s"), (m.tpot, "tpot_s"), (m.e2e, "e2e_s"), (m.overhead, "overhead_s")):
            if s[key] is not None:
                hist.observe(s[key])
        return s


def stages(marks: dict[str, float], relayed: float) -> dict[str, float]:
    """Seconds between consecutive hops, named "from->to", in the order the request passed them."""
    seq = sorted([*marks.items(), ("relayed", relayed)], key=lambda kv: kv[1])
    return {f"{a}->{b}": tb - ta for (a, ta), (b, tb) in zip(seq, seq[1:])}


def body_limit(state: AppState) -> int:
    """The largest body a valid request can have: its media base64-encoded, plus 1 MiB of text. A request
    carries one modality, so the largest allowance of a modality this model takes counts."""
    c = state.config
    per_modality = {"image": c.max_images_per_request * (c.max_image_bytes * 4 // 3 + 4),
                    "video": c.max_videos_per_request * (c.max_video_bytes * 4 // 3 + 64 * c.max_video_frames),
                    "audio": c.max_audios_per_request * (c.max_audio_bytes * 4 // 3 + 4)}
    return max(per_modality[m] for m in state.prompts.modalities) + (1 << 20)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it exceeds `limit`, before it is all in memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body is {int(declared)} bytes; the limit is {limit} "
                           "(images count base64-encoded; see --max-image-bytes)", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body exceeds {limit} bytes (see --max-image-bytes)", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes) -> ChatCompletionRequest:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, an integer too long to parse
        raise RequestError(f"request body is not valid JSON ({e}); send a chat completion request object") from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object with `model` and `messages`")
    return ChatCompletionRequest.model_validate(data)


INLINE_MAX_CHARS = 1024
"""A text-only request with at most this much text is built on the event loop (~0.2 ms here, most of it fixed
cost); the thread hop that keeps long tokenizations off the loop costs more than such a build itself."""


def _inline(req: ChatCompletionRequest) -> bool:
    """Whether building `req`'s prompt is short enough to run on the event loop: text only, and little of it."""
    chars = 0
    for m in req.messages:
        if isinstance(m.content, str):
            chars += len(m.content)
        elif m.content is not None:
            for part in m.content:
                if not isinstance(part, TextPart):
                    return False  # media: loading and checking it may take long
                chars += len(part.text)
        if chars > INLINE_MAX_CHARS:
            return False
    return True


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request, state: State) -> JSONResponse | StreamingResponse:
    t0, received = time.perf_counter(), time.time()
    try:
        req = _parse(await _read_body(request, body_limit(state)))
    except ValidationError as e:
        return JSONResponse(ErrorResponse.from_validation_errors(e.errors()).model_dump(), status_code=400)
    if req.model != state.config.model_name:
        raise RequestError(f"model '{req.model}' is not served here; GET /v1/models lists '{state.config.model_name}'",
                           param="model", status=404, code="model_not_found")
    rid = completion_id()
    ahead = media_ahead(state.prompts, req) if state.config.prompt_ahead else None
    if ahead is not None:  # the encode job leaves first; the prompt is built while the encoder runs
        built, flight = await dispatch_ahead(state, req, ahead, rid, received)
        sampling = flight.sampling
    else:
        built = state.prompts.build(req) if _inline(req) else await asyncio.to_thread(state.prompts.build, req)
        media = [(m.modality, m.data) for m in built.media]
        sampling = sampling_from_request(req, default_max_tokens=built.max_tokens)
        flight = Flight(rid, built.prompt_token_ids, sampling,
                        media_refs(state, rid, media, [m.num_tokens for m in built.media]), received,
                        inline=inline_bytes(media))
        state.flights.add(flight)
        await store_and_dispatch(state, flight, media)
    keys = [ref.key for ref in flight.media]
    tracker = Tracker(state, rid, len(built.prompt_token_ids), t0)
    tracker.flight = flight
    events = flight.stream(state.config.request_timeout_s)
    logprobs = LogprobRenderer(state.prompts.tokenizer) if sampling.logprobs is not None else None
    if req.stream:
        return StreamingResponse(_sse(state, req.model, tracker, events, keys, req.stream_options or StreamOptions(),
                                      logprobs), media_type="text/event-stream", headers={"X-Request-Id": rid})
    return await _complete(state, req.model, tracker, events, keys, request, logprobs)


async def _complete(state: AppState, model: str, tr: Tracker, events: AsyncIterator[TokenEvent],
                    keys: list[str], request: Request, logprobs: LogprobRenderer | None) -> JSONResponse:
    text: list[str] = []
    token_logprobs: list[TokenLogprobs] = []

    async def collect() -> None:
        async for ev in events:
            tr.see(ev)
            text.append(ev.text)
            token_logprobs.extend(ev.token_logprobs())

    collecting = asyncio.ensure_future(collect())
    watching = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait([collecting, watching], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself was cancelled (shutdown)
        collecting.cancel()
        raise
    finally:
        watching.cancel()
    if not collecting.done():  # the client went away: stop the workers spending compute on it
        await cancel_and_wait([collecting])
        await cleanup(state, tr.request_id, keys, finished=False)
        tr.record("disconnected")
        return JSONResponse(ErrorResponse.model_validate({"error": {"message": "client disconnected",
                            "type": "aborted"}}).model_dump(), status_code=499)
    try:
        collecting.result()
    except RelayTimeout as e:
        await cleanup(state, tr.request_id, keys, finished=False)
        tr.record("timeout")
        return JSONResponse(ErrorResponse.model_validate({"error": {"message": f"{e}; the request was aborted",
                            "type": "timeout"}}).model_dump(), status_code=504)
    await cleanup(state, tr.request_id, keys, finished=True)
    final = tr.final
    if final is None or final.finish_reason == "error":
        lost = tr.flight is not None and tr.flight.unavailable
        tr.record("unavailable" if lost else "error")
        msg = final.error if final and final.error else "the request failed in a worker"
        return JSONResponse(ErrorResponse.model_validate({"error": {
            "message": msg, "type": "server_error", "code": "worker_lost" if lost else None}}).model_dump(),
            status_code=503 if lost else 500, headers={"Retry-After": "1"} if lost else None)
    body = ChatCompletion(
        id=tr.request_id, created=int(time.time()), model=model,
        choices=[Choice(message=AssistantMessage(content="".join(text)),
                        finish_reason=openai_finish_reason(final.finish_reason),
                        logprobs=logprobs.choice(token_logprobs) if logprobs is not None else None)],
        usage=Usage.of(tr.prompt_tokens, tr.tokens),
    ).model_dump()
    body["tierserve"] = tr.record("ok")
    return JSONResponse(body, headers={"X-Request-Id": tr.request_id})


async def _until_disconnected(request: Request, poll_s: float = 0.25) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)


def _chunk(tr: Tracker, model: str, created: int, delta: Delta, finish=None, usage=None, choices=True,
           extra: dict | None = None, logprobs: ChoiceLogprobs | None = None) -> str:
    """One SSE event; the delta leaves out its None fields (OpenAI sends `role` on the first chunk only).

    The body is ChatCompletionChunk's JSON, built as a dict: one model built and dumped per token was a
    large share of a streamed request's cost, and every part of it is already validated (Delta, Usage,
    ChoiceLogprobs; `finish` comes from openai_finish_reason). tests/coordinator/test_sse_chunk.py holds it
    to the model's own dump."""
    body = {"id": tr.request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {k: v for k, v in (("role", delta.role), ("content", delta.content))
                                               if v is not None},
                         "finish_reason": finish,
                         "logprobs": logprobs.model_dump(mode="json") if logprobs is not None else None}]
            if choices else [],
            "usage": usage.model_dump(mode="json") if usage is not None else None}
    return f"data: {json.dumps({**body, **(extra or {})}, separators=(',', ':'))}\n\n"


async def _sse(state: AppState, model: str, tr: Tracker, events: AsyncIterator[TokenEvent], keys: list[str],
               options: StreamOptions, logprobs: LogprobRenderer | None) -> AsyncIterator[str]:
    """The stream of chunks; with continuous_usage_stats each carries the usage so far (vLLM's extension)."""
    created = int(time.time())
    finished = False

    def usage() -> Usage | None:
        return Usage.of(tr.prompt_tokens, tr.tokens) if options.continuous_usage_stats else None

    try:
        yield _chunk(tr, model, created, Delta(role="assistant", content=""), usage=usage())
        async for ev in events:
            tr.see(ev)
            if ev.finish_reason == "error":
                tr.record("unavailable" if tr.flight is not None and tr.flight.unavailable else "error")
                yield f"data: {json.dumps({'error': {'message': ev.error, 'type': 'server_error'}})}\n\n"
                break
            if ev.text or (logprobs is not None and ev.token_ids):
                yield _chunk(tr, model, created, Delta(content=ev.text), usage=usage(), logprobs=logprobs.choice(
                    ev.token_logprobs()) if logprobs is not None else None)
            if ev.finish_reason is not None:
                yield _chunk(tr, model, created, Delta(), finish=openai_finish_reason(ev.finish_reason), usage=usage())
                record = tr.record("ok")
                if options.include_usage:  # the usage chunk also carries the `tierserve` record, as a JSON answer does
                    yield _chunk(tr, model, created, Delta(), usage=Usage.of(tr.prompt_tokens, tr.tokens),
                                 choices=False, extra={"tierserve": record})
        finished = True
        yield "data: [DONE]\n\n"
    except RelayTimeout as e:
        tr.record("timeout")
        yield f"data: {json.dumps({'error': {'message': f'{e}; the request was aborted', 'type': 'timeout'}})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await asyncio.shield(cleanup(state, tr.request_id, keys, finished))
