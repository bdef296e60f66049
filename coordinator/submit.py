"""Turn a validated request into the first job of its pipeline, on the right worker."""

from __future__ import annotations

from coordinator.errors import RequestError
from coordinator.policies.base import PolicyConfig
from coordinator.protocol.messages import (
    EncodeJob,
    MediaRef,
    Modality,
    PrefillJob,
    SamplingParams,
    Timing,
)
from coordinator.protocol.registry import WorkerStatus, least_loaded
from coordinator.protocol.streams import push_job
from coordinator.state import AppState

PREFILL_ROLES = frozenset({"prefill", "combined"})


def text_targets(alive: list[WorkerStatus], policy: PolicyConfig) -> list[WorkerStatus]:
    """Where a text-only request may prefill: datacenter (remote) workers first; an encode GPU's own
    prefill worker only when there is none; its stealing worker only with stealing on."""
    remote = [w for w in alive if w.info.colocated_with is None]
    local = [w for w in alive if w.info.colocated_with is not None and w.info.role == "prefill"]
    steal = [w for w in alive if w.info.colocated_with is not None and w.info.role == "combined"]
    return remote or local or (steal if policy.stealing.enabled else [])


async def submit(state: AppState, request_id: str, prompt_token_ids: list[int], media: list[tuple[Modality, bytes]],
                 sampling: SamplingParams, received: float) -> list[str]:
    """Media (one modality) go to an encode worker (stored under TTL keys); text-only straight to an LLM worker.

    Returns the Redis keys to delete once the request is over.
    """
    state.counter += 1
    arrival = received
    timing = Timing(marks={"received": received})
    if media:
        target = least_loaded(await state.registry.alive(frozenset({"encode"})), state.counter)
        if target is None:
            raise RequestError("no encode worker is alive; start one (tierserve up --encode 1) and retry",
                               status=503, code="no_encode_worker")
        keys = [state.keys.media(request_id, i) for i in range(len(media))]
        pipe = state.redis.pipeline(transaction=False)
        for key, (_, raw) in zip(keys, media):
            pipe.set(key, raw, ex=state.config.media_ttl_s)
        await pipe.execute()
        refs = [MediaRef(key=k, kind=kind) for k, (kind, _) in zip(keys, media)]
        job = EncodeJob(request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
                        arrival=arrival, media=refs, timing=timing.mark("submitted"))
        await state.dispatcher.submit(target.info.worker_id, job)
        return keys
    target = least_loaded(text_targets(await state.registry.alive(PREFILL_ROLES), state.policy), state.counter)
    if target is None:
        raise RequestError("no prefill or combined LLM worker is alive; start one (tierserve up --llm combined)",
                           status=503, code="no_llm_worker")
    await push_job(state.redis, state.keys, target.info.worker_id, PrefillJob(
        request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling, arrival=arrival,
        timing=timing.mark("submitted")))
    return []
