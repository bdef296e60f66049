"""Turn a request (a Flight) into the first job of its pipeline, on the right worker; again on a re-run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from coordinator.errors import RequestError
from coordinator.flights import Flight
from coordinator.policies.base import PolicyConfig
from coordinator.protocol.messages import INLINE_MEDIA_MAX_BYTES, EncodeJob, MediaRef, Modality, PrefillJob, Timing
from coordinator.protocol.registry import WorkerStatus, least_loaded
from coordinator.protocol.roles import PREFILLING
from coordinator.protocol.streams import push_job
from coordinator.state import AppState

log = logging.getLogger(__name__)
T = TypeVar("T")
WAIT_FOR_WORKER_S = 2.0
"""How long a request waits for a worker of the role it needs to be alive before it is answered 503 (a
supervisor may be restarting one; after a Redis restart workers re-register within a heartbeat)."""
POLL_S = 0.25


def text_targets(alive: list[WorkerStatus], policy: PolicyConfig) -> list[WorkerStatus]:
    """Where a text-only request may prefill: datacenter (remote) workers first; an encode GPU's own
    prefill worker only when there is none; its stealing worker only with stealing on."""
    remote = [w for w in alive if w.info.colocated_with is None]
    local = [w for w in alive if w.info.colocated_with is not None and w.info.role == "prefill"]
    steal = [w for w in alive if w.info.colocated_with is not None and w.info.role == "combined"]
    return remote or local or (steal if policy.stealing.enabled else [])


def media_refs(state: AppState, request_id: str, media: list[tuple[Modality, bytes]],
               tokens: list[int] | None = None) -> list[MediaRef]:
    """Where each media item is stored (store_media), by key, with the placeholder tokens each expands to."""
    tokens = tokens or [0] * len(media)
    return [MediaRef(key=state.keys.media(request_id, i), kind=kind, tokens=n)
            for i, ((kind, _), n) in enumerate(zip(media, tokens, strict=True))]


def inline_bytes(media: list[tuple[Modality, bytes]]) -> list[bytes] | None:
    """The media's bytes when they are small enough to ride in the first encode job, else None."""
    if not media or sum(len(raw) for _, raw in media) > INLINE_MEDIA_MAX_BYTES:
        return None
    return [raw for _, raw in media]


async def store_media(state: AppState, refs: list[MediaRef], media: list[tuple[Modality, bytes]]) -> None:
    """Media bytes under TTL keys (the encode worker fetches them unless its job carries them; a re-run fetches
    them again)."""
    if refs:
        pipe = state.redis.pipeline(transaction=False)
        for ref, (_, raw) in zip(refs, media, strict=True):
            pipe.set(ref.key, raw, ex=state.config.media_ttl_s)
        await pipe.execute()


async def dispatch_soon(state: AppState, flight: Flight, wait_s: float = WAIT_FOR_WORKER_S) -> None:
    """`dispatch`, waiting up to `wait_s` for a worker of the needed role; RequestError (503) after that."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await dispatch(state, flight)
            return
        except RequestError as e:
            if e.status != 503 or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(POLL_S)


async def dispatch(state: AppState, flight: Flight) -> None:
    """Send the flight's current attempt on its way: media (one modality) to an encode worker's dispatch
    policy, text-only straight to an LLM worker. The chosen worker becomes the flight's holder."""
    state.counter += 1
    fields = dict(request_id=flight.request_id, prompt_token_ids=flight.prompt_token_ids, sampling=flight.sampling,
                  arrival=flight.received, timing=Timing(marks={"received": flight.received}).mark("submitted"),
                  attempt=flight.attempt, reply_to=state.reply_key, reply_addr=state.reply_addr or None,
                  output_token_ids=list(flight.output_token_ids))
    if flight.media:
        target = least_loaded(await state.routing.alive(frozenset({"encode"})), state.counter)
        if target is None:
            raise RequestError("no encode worker is alive; start one (tierserve up --encode 1) and retry",
                               status=503, code="no_encode_worker")
        flight.hold(target.info.holder)
        await state.dispatcher.submit(target.info.worker_id, EncodeJob(media=flight.encode_media(),
                                                                        prompt_key=flight.prompt_key, **fields),
                                      target.info.job_address)
        return
    target = least_loaded(text_targets(await state.routing.alive(PREFILLING), state.policy), state.counter)
    if target is None:
        raise RequestError("no prefill or combined LLM worker is alive; start one (tierserve up --llm combined)",
                           status=503, code="no_llm_worker")
    flight.hold(target.info.holder)
    await push_job(state.redis, state.keys, target.info.worker_id, PrefillJob(**fields))


async def cleanup(state: AppState, request_id: str, keys: list[str], finished: bool) -> None:
    """Best effort: with Redis down, the media keys' TTL and the workers' own limits clean up instead."""
    state.flights.remove(request_id)
    try:
        if not finished:  # client went away or timed out: stop the workers spending compute on it
            await state.redis.publish(state.keys.aborts, request_id)
        if keys:
            await state.redis.delete(*keys)
    except Exception as e:
        log.warning("request cleanup failed", extra={"request_id": request_id, "error": str(e)})


async def store_and_dispatch(state: AppState, flight: Flight, media: list[tuple[Modality, bytes]],
                             beside: Callable[[], Awaitable[T]] | None = None) -> T | None:
    """Store the media and send the first run on its way: at once when its encode job carries the bytes (the
    encode worker never waits for the store, which only a re-run needs), else the store first. `beside()` starts
    as soon as the job is on its way and runs with the store (a prompt sent after its job is built there,
    prompt_ahead.py); its result is returned. On a failure of any of them nothing stays stored or running."""
    keys = [ref.key for ref in flight.media]
    storing = asyncio.ensure_future(store_media(state, flight.media, media)) if flight.inline else None
    after: asyncio.Future[T] | None = None
    dispatched = False
    try:
        if storing is None:
            await store_media(state, flight.media, media)
        await dispatch_soon(state, flight)
        dispatched = True
        after = asyncio.ensure_future(beside()) if beside is not None else None
        if storing is not None:
            await storing
        return await after if after is not None else None
    except BaseException:
        for pending in (storing, after):  # let them settle, so the clean-up's delete comes after a store
            if pending is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(pending)
        await asyncio.shield(cleanup(state, flight.request_id, keys, finished=not dispatched))
        raise
    finally:
        flight.inline = None  # the job holds them now; a re-run reads the keys
