"""The encode worker's side of a prompt sent after its job (encode_node/prompts.py), on a real Redis: popped as it
comes, a refusal drops the job, a prompt that never comes fails it after a bounded wait."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import EncodeJob, MediaRef, PromptReady, SamplingParams, Timing
from encode_node.prompts import fill, placeholder_tokens, pop_prompts

IMAGE = 7


def _job(rid: str, key: str | None, ids: list[int] | None = None) -> EncodeJob:
    return EncodeJob(request_id=rid, prompt_token_ids=ids or [], sampling=SamplingParams(), arrival=0.0,
                     prompt_key=key, media=[MediaRef(key=f"m:{rid}", tokens=3)],
                     timing=Timing(marks={"received": 1.0}))


def _ready(ids: list[int], max_tokens: int = 9) -> PromptReady:
    return PromptReady(prompt_token_ids=ids, sampling=SamplingParams(max_tokens=max_tokens), built_at=2.0)


@pytest.mark.redis
def test_prompts_are_popped_as_they_come_and_a_missing_one_is_named(redis_url, key_prefix):
    keys = Keys(key_prefix)

    async def go():
        r = aioredis.Redis.from_url(redis_url)
        try:
            jobs = [_job("early", keys.prompt("early")), _job("late", keys.prompt("late")),
                    _job("refused", keys.prompt("refused")), _job("garbled", keys.prompt("garbled")),
                    _job("carried", None, [1, IMAGE, 2])]
            await r.rpush(keys.prompt("early"), _ready([1, IMAGE, 2]).model_dump_json())
            await r.rpush(keys.prompt("refused"), PromptReady(refused="prompt too long").model_dump_json())
            await r.rpush(keys.prompt("garbled"), b'{"prompt_token_ids": []}')

            async def late():
                await asyncio.sleep(0.2)
                await r.rpush(keys.prompt("late"), _ready([5, IMAGE]).model_dump_json())

            t0 = time.monotonic()
            (got, why), _ = await asyncio.gather(pop_prompts(r, jobs, wait_s=3.0), late())
            waited = time.monotonic() - t0
            t0 = time.monotonic()
            none, why_none = await pop_prompts(r, [_job("never", keys.prompt("never"))], wait_s=0.3)
            return jobs, got, why, waited, none, why_none, time.monotonic() - t0, await r.exists(keys.prompt("early"))
        finally:
            await r.delete(*[keys.prompt(k) for k in ("early", "late", "refused", "garbled", "never")])
            await r.aclose()

    jobs, got, why, waited, none, why_none, waited_none, left = asyncio.run(go())
    assert set(got) == {"early", "late", "refused", "garbled"} and why == ""
    assert 0.2 <= waited < 1.0  # returned when the late one came, not at the deadline
    assert left == 0  # popped, nothing left behind
    assert none == {} and "no prompt within 0.3 s" in why_none and 0.3 <= waited_none < 1.0
    early = fill(jobs[0], got["early"])
    assert early.prompt_token_ids == [1, IMAGE, 2] and early.sampling.max_tokens == 9 and early.prompt_key is None
    assert early.timing.marks == {"received": 1.0, "prompt_built": 2.0}
    assert fill(jobs[2], got["refused"]) is None
    assert "malformed" in got["garbled"].refused and fill(jobs[3], got["garbled"]) is None
    assert fill(jobs[4], None) is jobs[4]  # it carried its prompt
    assert fill(_job("x", keys.prompt("x")), None) is None


def test_placeholder_tokens_come_from_the_ids_or_from_the_media_while_the_prompt_is_to_come():
    ids = frozenset({IMAGE})
    assert placeholder_tokens(_job("a", None, [1, IMAGE, IMAGE, 2]), ids) == 2
    assert placeholder_tokens(_job("b", "k"), ids) == 3


def test_a_prompt_is_ready_or_refused():
    with pytest.raises(ValueError, match="ids and sampling"):
        PromptReady(prompt_token_ids=[1])
    with pytest.raises(ValueError, match="ids and sampling"):
        PromptReady(sampling=SamplingParams())
    assert PromptReady(refused="gone").refused == "gone"
