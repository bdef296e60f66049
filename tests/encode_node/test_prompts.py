"""The encode worker's side of a prompt sent after its job (encode_node/prompts.py), on a real Redis: the BLPOP is
on the wire before the forward would start, prompts are popped as they come, a refusal drops the job, a prompt
that never comes fails it after a bounded wait."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import EncodeJob, MediaRef, PromptReady, SamplingParams, Timing
from encode_node.prompts import PromptPop, fill, placeholder_tokens

IMAGE = 7


def _job(rid: str, key: str | None, ids: list[int] | None = None) -> EncodeJob:
    return EncodeJob(request_id=rid, prompt_token_ids=ids or [], sampling=SamplingParams(), arrival=0.0,
                     prompt_key=key, media=[MediaRef(key=f"m:{rid}", tokens=3)],
                     timing=Timing(marks={"received": 1.0}))


def _ready(ids: list[int], max_tokens: int = 9) -> PromptReady:
    return PromptReady(prompt_token_ids=ids, sampling=SamplingParams(max_tokens=max_tokens), built_at=2.0)


@pytest.mark.redis
def test_the_pop_is_served_while_the_worker_is_busy_and_read_after(redis_url, key_prefix):
    """After send(), Redis hands a prompt pushed later to the waiting BLPOP although nothing reads the reply yet
    (the worker is in its forward); result() then reads it without another round trip."""
    keys = Keys(key_prefix)

    async def go():
        r, other = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
        try:
            pop = PromptPop(r, [_job("a", keys.prompt("a"))])
            await pop.send()
            await other.rpush(keys.prompt("a"), _ready([1, IMAGE]).model_dump_json())
            time.sleep(0.05)  # blocking, as a forward holding the GIL does: the reply waits in the socket
            left = await other.llen(keys.prompt("a"))
            got, why = await pop.result()
            return left, got, why
        finally:
            await other.delete(keys.prompt("a"))
            await r.aclose()
            await other.aclose()

    left, got, why = asyncio.run(go())
    assert left == 0  # Redis served the BLPOP sent before
    assert got["a"].prompt_token_ids == [1, IMAGE] and why == ""


@pytest.mark.redis
def test_prompts_are_popped_as_they_come_and_a_missing_one_is_named(redis_url, key_prefix):
    keys = Keys(key_prefix)
    names = ("early", "late", "refused", "garbled", "never")

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
            pop = PromptPop(r, jobs, wait_s=3.0)
            await pop.send()
            (got, why), _ = await asyncio.gather(pop.result(), late())
            waited = time.monotonic() - t0
            t0 = time.monotonic()
            never = PromptPop(r, [_job("never", keys.prompt("never"))], wait_s=0.3)
            await never.send()
            none, why_none = await never.result()
            return jobs, got, why, waited, none, why_none, time.monotonic() - t0, await r.exists(keys.prompt("early"))
        finally:
            await r.delete(*[keys.prompt(k) for k in names])
            await r.aclose()

    jobs, got, why, waited, none, why_none, waited_none, left = asyncio.run(go())
    assert set(got) == {"early", "late", "refused", "garbled"} and why == ""
    assert 0.2 <= waited < 1.0  # returned when the late one came, not at the deadline
    assert left == 0  # popped, nothing left behind
    assert none == {} and "no prompt within 0.3 s" in why_none and 0.3 <= waited_none < 1.5
    early = fill(jobs[0], got["early"])
    assert early.prompt_token_ids == [1, IMAGE, 2] and early.sampling.max_tokens == 9 and early.prompt_key is None
    assert early.timing.marks == {"received": 1.0, "prompt_built": 2.0}
    assert fill(jobs[2], got["refused"]) is None
    assert "malformed" in got["garbled"].refused and fill(jobs[3], got["garbled"]) is None
    assert fill(jobs[4], None) is jobs[4]  # it carried its prompt
    assert fill(_job("x", keys.prompt("x")), None) is None


@pytest.mark.redis
def test_a_pop_closed_unread_leaves_a_usable_client(redis_url, key_prefix):
    """The forward failed: the BLPOP's connection goes back disconnected, and the client works on."""
    keys = Keys(key_prefix)

    async def go():
        r = aioredis.Redis.from_url(redis_url)
        try:
            pop = PromptPop(r, [_job("c", keys.prompt("c"))], wait_s=5.0)
            await pop.send()
            t0 = time.monotonic()
            await pop.close()
            closed_in = time.monotonic() - t0
            await r.set(keys.prompt("probe"), b"1")
            return closed_in, await r.get(keys.prompt("probe"))
        finally:
            await r.delete(keys.prompt("probe"))
            await r.aclose()

    closed_in, value = asyncio.run(go())
    assert closed_in < 1.0 and value == b"1"


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
