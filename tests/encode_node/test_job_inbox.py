"""An encode worker's two ways in (encode_node/job_inbox.py), with the coordinator's real dispatcher and job links
on real Redis and real TCP sockets: a micro-batch goes over the link once it is up and the stream stands in before;
batches are taken in arrival order whichever way they came, a job that came both ways is taken once, the queue
count covers both, and a link frame that is not a micro-batch closes the link (the coordinator then appends it to
the stream, where the worker drops it)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from coordinator.dispatch import EncodeDispatcher
from coordinator.policies.base import BatchPolicyConfig
from coordinator.policies.registry import make_batch_policy
from coordinator.protocol.keys import Keys
from coordinator.protocol.links import Links
from coordinator.protocol.messages import EncodeBatch, EncodeJob, MediaRef, PrefillJob, SamplingParams
from coordinator.protocol.process import cancel_and_wait
from coordinator.protocol.streams import JobStream, append_jobs, job_fields
from encode_node.job_inbox import JobInbox

pytestmark = pytest.mark.redis
SECRET = b"k" * 32


def _job(rid: str, attempt: int = 0) -> EncodeJob:
    return EncodeJob(request_id=rid, prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=2),
                     arrival=time.time(), media=[MediaRef(key=f"m:{rid}")], attempt=attempt)


async def _until(cond, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


@pytest.fixture
async def inbox(redis_url, key_prefix):
    """A listening inbox for worker enc-0 on real Redis; closed, its stream deleted and the client closed after."""
    redis = Redis.from_url(redis_url)
    jobs = JobStream(redis, Keys(key_prefix), "enc-0")
    await jobs.open()
    box = JobInbox(redis, jobs, SECRET)
    await box.listen("127.0.0.1")
    try:
        yield box
    finally:
        await box.close()
        await jobs.delete()
        await redis.aclose()


async def _take_all(inbox: JobInbox) -> list[tuple[bool, list[str]]]:
    """(came by the stream, request ids) of every batch queued now, done as the worker does."""
    out = []
    while (got := await inbox.next(0.3)) is not None:
        entry_id, jobs = got
        out.append((entry_id is not None, [j.request_id for j in jobs]))
        await inbox.done(entry_id)
    return out


async def _read_stream_forever(inbox: JobInbox) -> None:
    while True:
        await inbox.read_stream_once()


async def test_the_dispatcher_writes_batches_over_the_job_link_once_it_is_up(inbox, key_prefix):
    redis = inbox.redis
    links = Links(lambda e: append_jobs(redis, e), "coordinator-1", SECRET)
    disp = EncodeDispatcher(redis, Keys(key_prefix), BatchPolicyConfig(name="pass_through"), make_batch_policy,
                            links=links)
    reader = asyncio.create_task(_read_stream_forever(inbox))
    try:
        await disp.submit("enc-0", _job("r0"), inbox.listener.address)  # the link opens meanwhile
        await _until(lambda: links.slots[(inbox.jobs.key, inbox.listener.address)].link is not None)
        for i in range(1, 4):
            await disp.submit("enc-0", _job(f"r{i}"), inbox.listener.address)
        await _until(lambda: len(inbox.queue) == 4)
        assert await _take_all(inbox) == [(True, ["r0"]), (False, ["r1"]), (False, ["r2"]), (False, ["r3"])]
        assert links.counts == {"direct": 3, "stream": 1, "resent": 0}
        assert await inbox.waiting() == 0  # acked and deleted, nothing queued by the link
    finally:
        await cancel_and_wait([reader])
        await links.close()


async def test_a_job_that_came_both_ways_is_taken_once_and_the_count_covers_both(inbox):
    inbox._take(EncodeBatch(jobs=[_job("a"), _job("b")]).model_dump_json().encode())  # as the link delivers
    # The link broke before its ack reached the coordinator: the same batch, and a re-run of b, on the stream.
    await inbox.redis.xadd(inbox.jobs.key, job_fields(EncodeBatch(jobs=[_job("a"), _job("b"), _job("b", attempt=1)])))
    await inbox.read_stream_once()
    assert await inbox.waiting() == 2  # one on the link's side, one stream entry
    assert await _take_all(inbox) == [(False, ["a", "b"]), (True, ["b"])]
    assert await inbox.waiting() == 0


async def test_the_stream_is_read_one_entry_ahead_of_the_encoder_at_most(inbox):
    reader = asyncio.create_task(_read_stream_forever(inbox))
    try:
        for i in range(3):
            await inbox.redis.xadd(inbox.jobs.key, job_fields(EncodeBatch(jobs=[_job(f"s{i}")])))
        await _until(lambda: len(inbox.queue) == 1)
        await asyncio.sleep(0.2)
        assert len(inbox.queue) == 1  # the rest stay on the stream (its length counts them)
        assert await inbox.waiting() == 3
        got = await _take_all(inbox)
        assert got == [(True, ["s0"]), (True, ["s1"]), (True, ["s2"])]
    finally:
        await cancel_and_wait([reader])


async def test_a_link_frame_that_is_no_micro_batch_closes_the_link_and_goes_to_the_stream(inbox):
    links = Links(lambda e: append_jobs(inbox.redis, e), "coordinator-1", SECRET, retry_s=60)
    address = inbox.listener.address
    try:
        await links.publish([(inbox.jobs.key, address, EncodeBatch(jobs=[_job("x")]).model_dump_json().encode())])
        await _until(lambda: links.slots[(inbox.jobs.key, address)].link is not None)
        wrong = PrefillJob(request_id="p", prompt_token_ids=[1], sampling=SamplingParams(), arrival=0.0)
        await links.publish([(inbox.jobs.key, address, wrong.model_dump_json().encode())])
        await _until(lambda: links.counts["resent"] == 1)  # refused: the coordinator appends it to the stream
        taken = []
        for _ in range(2):
            await inbox.read_stream_once()
            taken += await _take_all(inbox)
        assert taken == [(True, ["x"]), (True, [])]  # the PrefillJob is no encode job: the worker takes nothing
        assert inbox.link_queued == 0 and await inbox.waiting() == 0
    finally:
        await links.close()
