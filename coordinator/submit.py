"""Turn a validated request into the first job of its pipeline, on the right worker."""

from __future__ import annotations

from coordinator.errors import RequestError
from coordinator.protocol.messages import EncodeJob, MediaRef, PrefillJob, SamplingParams, Timing
from coordinator.protocol.registry import least_loaded
from coordinator.protocol.streams import push_job
from coordinator.state import AppState

PREFILL_ROLES = frozenset({"prefill", "combined"})


async def submit(state: AppState, request_id: str, prompt_token_ids: list[int], images: list[bytes],
                 sampling: SamplingParams, received: float) -> list[str]:
    """Images go to an encode worker (media stored under TTL keys); text-only straight to an LLM worker.

    Returns the Redis keys to delete once the request is over.
    """
    state.counter += 1
    arrival = received
    timing = Timing(marks={"received": received})
    if images:
        target = least_loaded(await state.registry.alive(frozenset({"encode"})), state.counter)
        if target is None:
            raise RequestError("no encode worker is alive; start one (tierserve up --encode 1) and retry",
                               status=503, code="no_encode_worker")
        keys = [state.keys.media(request_id, i) for i in range(len(images))]
        pipe = state.redis.pipeline(transaction=False)
        for key, raw in zip(keys, images):
            pipe.set(key, raw, ex=state.config.media_ttl_s)
        await pipe.execute()
        job = EncodeJob(request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
                        arrival=arrival, media=[MediaRef(key=k) for k in keys], timing=timing.mark("submitted"))
        await state.dispatcher.submit(target.info.worker_id, job)
        return keys
    target = least_loaded(await state.registry.alive(PREFILL_ROLES), state.counter)
    if target is None:
        raise RequestError("no prefill or combined LLM worker is alive; start one (tierserve up --llm combined)",
                           status=503, code="no_llm_worker")
    await push_job(state.redis, state.keys, target.info.worker_id, PrefillJob(
        request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling, arrival=arrival,
        timing=timing.mark("submitted")))
    return []
