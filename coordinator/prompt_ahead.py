"""An image request's encode job sent before its prompt is built, so the coordinator builds it while the encoder runs.

Building a prompt (every image's pixels decoded at 1/8 scale to prove the file whole, the chat template rendered,
the text tokenized, the length checked) took ~1.2 ms at light load, all of it before the encode job left; the
encoder needs only the images. When every media part of a request is an image data URL whose header passes the
limits, all of them small enough to ride in the job (INLINE_MEDIA_MAX_BYTES), and its text is short enough that
its build is quick (AHEAD_MAX_CHARS), the job leaves first with `prompt_key` set and the prompt follows as a
PromptReady on that Redis list, built meanwhile on the coordinator (on a core of its own when the encoder has
one). The encode worker pops it beside its forward and fills the job in before the embeddings leave
(encode_node/worker.py). Any request outside these cases is built first, as before.

Off unless the coordinator runs with --prompt-ahead (CoordinatorConfig.prompt_ahead). Measured on a 2-core host
running every process (benchmarks/results/bench-vllm-fast-host/trials20/): the way to the encoder 1.1-1.2 ms
shorter, the way from it to the first token 0.4-1.6 ms longer, TTFT p50 no better; the coordinator's work moved
later lands beside the LLM worker's on the one core not encoding. It is meant for a coordinator on cores of its own.

A request whose build then fails (a corrupt image body, a prompt too long, a template error) gets the error the
ordinary order would have given, and its PromptReady says `refused`, so the encoder drops what it computed. The
failover re-runs such a flight only once its prompt is built (a re-run carries it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from coordinator.api.schema import ChatCompletionRequest, ImageURLPart, TextPart
from coordinator.errors import RequestError
from coordinator.flights import Flight
from coordinator.media import MediaError, image_data_url_bytes, image_header
from coordinator.prompt import BuiltPrompt, PromptBuilder, sampling_from_request
from coordinator.protocol.messages import INLINE_MEDIA_MAX_BYTES, Modality, PromptReady
from coordinator.state import AppState
from coordinator.submit import media_refs, store_and_dispatch

AHEAD_MAX_CHARS = 64 * 1024
"""A request with more text than this is built before its encode job leaves: an encode worker waits for the
prompt of a job sent ahead, and tokenizing this much takes ~0.1 s on one core."""


@dataclass(frozen=True)
class MediaAhead:
    """What an encode job needs before the prompt exists: the images' bytes and the tokens each expands to."""

    media: list[tuple[Modality, bytes]]
    tokens: list[int]


def media_ahead(builder: PromptBuilder, req: ChatCompletionRequest) -> MediaAhead | None:
    """The request's images when its encode job can leave before its prompt is built, else None (a request that
    is not eligible, or whose media fail the header checks: the ordinary build then answers it). It runs on the
    event loop, so nothing is decoded before the parts' count and encoded size say the request qualifies."""
    if "image" not in builder.view.placeholders:
        return None
    urls: list[str] = []
    chars = 0
    for msg in req.messages:
        if msg.content is None or isinstance(msg.content, str):
            chars += len(msg.content or "")
            continue
        for part in msg.content:
            if isinstance(part, TextPart):
                chars += len(part.text)
            elif isinstance(part, ImageURLPart) and part.image_url.url.startswith("data:"):
                urls.append(part.image_url.url)
            else:
                return None  # video, audio, a local path: built first
    if (not urls or len(urls) > builder.limits.max_images_per_request or chars > AHEAD_MAX_CHARS
            or sum(len(u) for u in urls) * 3 // 4 > INLINE_MEDIA_MAX_BYTES + 1024):  # base64: 4 chars per 3 bytes
        return None
    media: list[tuple[Modality, bytes]] = []
    sizes: list[tuple[int, int]] = []
    for url in urls:
        try:
            data = image_data_url_bytes(url, builder.limits, None)
            _, width, height = image_header(data, builder.limits)
        except MediaError:
            return None
        media.append(("image", data))
        sizes.append((height, width))
    if sum(len(raw) for _, raw in media) > INLINE_MEDIA_MAX_BYTES:
        return None
    return MediaAhead(media, builder.view.image_tokens(sizes))


async def dispatch_ahead(state: AppState, req: ChatCompletionRequest, ahead: MediaAhead, request_id: str,
                         received: float) -> tuple[BuiltPrompt, Flight]:
    """Send the request's encode job, then build its prompt (beside the media's store) and hand it to that job's
    encode worker. Raises what the build raises (the worker is told the request was refused), or what
    dispatching raises; nothing stays stored or running then (store_and_dispatch)."""
    key = state.keys.prompt(request_id)
    provisional = sampling_from_request(req)  # the build's default max_tokens replaces it; its errors come first
    flight = Flight(request_id, [], provisional, media_refs(state, request_id, ahead.media, ahead.tokens), received,
                    inline=[raw for _, raw in ahead.media], prompt_key=key)

    async def build_and_hand_over() -> BuiltPrompt:
        try:
            built = await asyncio.to_thread(state.prompts.build, req)
            ready = PromptReady(prompt_token_ids=built.prompt_token_ids, built_at=time.time(),
                                sampling=sampling_from_request(req, default_max_tokens=built.max_tokens))
            flight.prompt_token_ids, flight.sampling, flight.prompt_key = ready.prompt_token_ids, ready.sampling, None
            await push_prompt(state, key, ready)
        except BaseException as e:
            why = e.message if isinstance(e, RequestError) else f"{type(e).__name__}: {e}"
            with contextlib.suppress(Exception):  # with Redis away the worker's wait ends on its own (PROMPT_WAIT_S)
                await asyncio.shield(push_prompt(state, key, PromptReady(refused=why)))
            if isinstance(e, RequestError) or not isinstance(e, Exception):
                raise
            raise RequestError(f"the request's prompt could not reach its encode worker ({why}); retry it",
                               status=503, code="prompt_not_delivered") from e
        return built

    state.flights.add(flight)
    built = await store_and_dispatch(state, flight, ahead.media, beside=build_and_hand_over)
    return built, flight


async def push_prompt(state: AppState, key: str, ready: PromptReady) -> None:
    """The PromptReady onto its list, which lives as long as the request's media may (an encode job may wait in a
    micro-batch and on the stream before its worker pops it)."""
    pipe = state.redis.pipeline(transaction=False)
    pipe.rpush(key, ready.model_dump_json())
    pipe.expire(key, state.config.media_ttl_s)
    await pipe.execute()
