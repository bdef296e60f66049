"""Turn a request (a Flight) into the first job of its pipeline, on the right worker; again on a re-run."""

from __future__ import annotations

import asyncio
import time

from coordinator.errors import RequestError
from coordinator.flights import Flight
from coordinator.policies.base import PolicyConfig
from coordinator.protocol.messages import EncodeJob, Modality, PrefillJob, Timing
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


async def store_media(state: AppState, request_id: str, media: list[tuple[Modality, bytes]]) -> list[str]:
    """Media bytes under TTL keys (the encode worker fetches them; a re-run fetches them again)."""
    keys = [state.keys.media(request_id, i) for i in range(len(media))]
    if keys:
        pipe = state.redis.pipeline(transaction=False)
        for key, (_, raw) in zip(keys, media):
            pipe.set(key, raw, ex=state.config.media_ttl_s)
        await pipe.execute()
    return keys


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
        await state.dispatcher.submit(target.info.worker_id, EncodeJob(media=flight.media, **fields))
        return
    target = least_loaded(text_targets(await state.routing.alive(PREFILLING), state.policy), state.counter)
    if target is None:
        raise RequestError("no prefill or combined LLM worker is alive; start one (tierserve up --llm combined)",
                           status=503, code="no_llm_worker")
    flight.hold(target.info.holder)
    await push_job(state.redis, state.keys, target.info.worker_id, PrefillJob(**fields))
