"""Turn a request (a Flight) into the first job of its pipeline, on the right worker; again on a re-run."""

from __future__ import annotations

import asyncio
import time

from coordinator.errors import RequestError
from coordinator.flights import Flight
from coordinator.policies.base import PolicyConfig
from coordinator.protocol.messages import INLINE_MEDIA_MAX_BYTES, EncodeJob, MediaRef, Modality, PrefillJob, Timing
from coordinator.protocol.registry import WorkerStatus, least_loaded
from coordinator.protocol.roles import PREFILLING
from coordinator.protocol.streams import push_job
from coordinator.state import AppState

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


def media_refs(state: AppState, request_id: str, media: list[tuple[Modality, bytes]]) -> list[MediaRef]:
    """Where each media item is stored (store_media), by key."""
    return [MediaRef(key=state.keys.media(request_id, i), kind=kind) for i, (kind, _) in enumerate(media)]


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
                  attempt=flight.attempt, reply_to=state.reply_key, output_token_ids=list(flight.output_token_ids))
    if flight.media:
        target = least_loaded(await state.routing.alive(frozenset({"encode"})), state.counter)
        if target is None:
            raise RequestError("no encode worker is alive; start one (tierserve up --encode 1) and retry",
                               status=503, code="no_encode_worker")
        flight.hold(target.info.holder)
        await state.dispatcher.submit(target.info.worker_id, EncodeJob(media=flight.encode_media(), **fields))
        return
    target = least_loaded(text_targets(await state.routing.alive(PREFILLING), state.policy), state.counter)
    if target is None:
        raise RequestError("no prefill or combined LLM worker is alive; start one (tierserve up --llm combined)",
                           status=503, code="no_llm_worker")
    flight.hold(target.info.holder)
    await push_job(state.redis, state.keys, target.info.worker_id, PrefillJob(**fields))
