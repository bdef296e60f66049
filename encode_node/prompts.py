"""The prompts of encode jobs that left the coordinator before them (coordinator/prompt_ahead.py).

Such a job has `prompt_key` set, no prompt ids and a provisional sampling. The worker pops the PromptReady of
every such job of a micro-batch beside its forward (one BLPOP, which returns at once when the coordinator was
quicker than the encoder), then fills each job in before its embeddings leave. A refused prompt (the client
was answered with an error meanwhile) drops the job; one that does not come within PROMPT_WAIT_S (the
coordinator died, Redis lost it) fails the request with an error instead of holding the encoder longer.
"""

from __future__ import annotations

import logging
import time

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from coordinator.protocol.messages import EncodeJob, PromptReady

log = logging.getLogger(__name__)
PROMPT_WAIT_S = 5.0
"""Longest wait for a prompt sent after its job. The coordinator builds it in ~1 ms (AHEAD_MAX_CHARS bounds
the text), so this is reached only when it will never come."""


def placeholder_tokens(job: EncodeJob, placeholder_ids: frozenset[int] | set[int]) -> int:
    """Tokens the job's media expand to in its prompt (the SM split weighs a micro-batch by them): counted in its
    ids, or as the coordinator counted them per item when the prompt is still to come."""
    if job.prompt_key is not None:
        return sum(ref.tokens for ref in job.media)
    return sum(t in placeholder_ids for t in job.prompt_token_ids)


async def pop_prompts(redis: Redis, jobs: list[EncodeJob], wait_s: float = PROMPT_WAIT_S
                      ) -> tuple[dict[str, PromptReady], str]:
    """The PromptReady of each job with a `prompt_key`, by request id, as they come, for at most `wait_s`; and
    why any missing one is missing."""
    waiting = {j.prompt_key: j.request_id for j in jobs if j.prompt_key is not None}
    got: dict[str, PromptReady] = {}
    deadline = time.monotonic() + wait_s
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            return got, f"the coordinator sent no prompt within {wait_s:g} s"
        try:
            popped = await redis.blpop(list(waiting), timeout=left)
        except (RedisError, OSError) as e:
            return got, f"its prompt could not be read from Redis ({e})"
        if popped is None:
            continue
        key, raw = popped
        request_id = waiting.pop(key.decode() if isinstance(key, bytes) else key, None)
        if request_id is None:
            continue
        try:
            got[request_id] = PromptReady.model_validate_json(raw)
        except ValidationError as e:
            got[request_id] = PromptReady(refused=f"its prompt message is malformed: {e.errors()[0]['msg']}")
    return got, ""


def fill(job: EncodeJob, ready: PromptReady | None) -> EncodeJob | None:
    """The job with its prompt; the job itself when it carried one; None when its prompt was refused or is
    missing (the caller fails it in the latter case)."""
    if job.prompt_key is None:
        return job
    if ready is None:
        return None
    if ready.refused is not None:
        log.info("dropped a request answered before its prompt was built",
                 extra={"request_id": job.request_id, "reason": ready.refused})
        return None
    timing = job.timing.model_copy(update={"marks": {**job.timing.marks, "prompt_built": ready.built_at}})
    return job.model_copy(update={"prompt_token_ids": ready.prompt_token_ids, "sampling": ready.sampling,
                                  "prompt_key": None, "timing": timing})
