"""The prompts of encode jobs that left the coordinator before them (coordinator/prompt_ahead.py).

Such a job has `prompt_key` set, no prompt ids and a provisional sampling. The worker pops the PromptReady of
every such job of a micro-batch beside its forward (one BLPOP sent before it, PromptPop), then fills each job in
before its embeddings leave. A refused prompt (the client was answered with an error meanwhile) drops the job; one
that does not come within PROMPT_WAIT_S (the coordinator died, Redis lost it) fails the request with an error
instead of holding the encoder longer.
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


class PromptPop:
    """The PromptReady of each job of a micro-batch that has a `prompt_key`, by request id.

    `send()` puts one BLPOP on all their keys on the wire before the forward starts; `result()` reads its reply
    after the forward. Sent from a task instead, the command went out only once the forward was over (the event
    loop gets the GIL back from the forward's thread only then), and its round trip came after it: ~0.2-0.5 ms
    between the encoder's end and the embeddings leaving, in a live probe. A batch with more than one such job
    pops the rest after the first: those already pushed in one pipelined round trip, then any still to come."""

    def __init__(self, redis: Redis, jobs: list[EncodeJob], wait_s: float = PROMPT_WAIT_S) -> None:
        self.redis, self.wait_s = redis, wait_s
        self.waiting = {j.prompt_key: j.request_id for j in jobs if j.prompt_key is not None}
        self.deadline = time.monotonic() + wait_s
        self._conn = None
        self._failed = ""

    async def send(self) -> None:
        """The BLPOP on the wire (no reply read); a failure is kept for `result` to report."""
        if not self.waiting:
            return
        try:
            self._conn = await self.redis.connection_pool.get_connection()
            await self._conn.send_command("BLPOP", *self.waiting, self.wait_s)
        except (RedisError, OSError) as e:
            self._failed = f"its prompt could not be read from Redis ({e})"
            await self.close()

    async def result(self) -> tuple[dict[str, PromptReady], str]:
        """The prompts that came within the wait, and why any missing one is missing ("" when none is)."""
        got: dict[str, PromptReady] = {}
        if self._conn is not None:
            try:
                reply = await self._conn.read_response()
            except (RedisError, OSError) as e:
                await self.close()
                return got, f"its prompt could not be read from Redis ({e})"
            await self.redis.connection_pool.release(self._conn)
            self._conn = None
            if reply:
                _take(self.waiting, reply[0], reply[1], got)
        if self._failed or not self.waiting:
            return got, self._failed
        try:  # the rest of a batch: those already there in one round trip, then a wait for any still to come
            pipe = self.redis.pipeline(transaction=False)
            for key in self.waiting:
                pipe.lpop(key)
            for key, raw in zip(list(self.waiting), await pipe.execute()):
                if raw is not None:
                    _take(self.waiting, key, raw, got)
        except (RedisError, OSError) as e:
            return got, f"its prompt could not be read from Redis ({e})"
        rest, why = await _pop_rest(self.redis, self.waiting, self.deadline, self.wait_s)
        return got | rest, why

    async def close(self) -> None:
        """Give the connection back with its reply unread: disconnected first (the forward failed, or the send did)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.disconnect()
            await self.redis.connection_pool.release(conn)


def _take(waiting: dict[str, str], key: bytes | str, raw: bytes, got: dict[str, PromptReady]) -> None:
    request_id = waiting.pop(key.decode() if isinstance(key, bytes) else key, None)
    if request_id is None:
        return
    try:
        got[request_id] = PromptReady.model_validate_json(raw)
    except ValidationError as e:
        got[request_id] = PromptReady(refused=f"its prompt message is malformed: {e.errors()[0]['msg']}")


async def _pop_rest(redis: Redis, waiting: dict[str, str], deadline: float, wait_s: float
                    ) -> tuple[dict[str, PromptReady], str]:
    """The PromptReady on each key of `waiting` (prompt key -> request id), by request id, as they come, until
    `deadline` (time.monotonic()); and why any missing one is missing."""
    got: dict[str, PromptReady] = {}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            return got, f"the coordinator sent no prompt within {wait_s:g} s"
        try:
            popped = await redis.blpop(list(waiting), timeout=left)
        except (RedisError, OSError) as e:
            return got, f"its prompt could not be read from Redis ({e})"
        if popped is not None:
            _take(waiting, popped[0], popped[1], got)
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
