"""A request's small media ride in its first encode job: the encode worker reads them there, not from Redis,
while the stored copy serves a re-run."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from coordinator.flights import Flight
from coordinator.protocol.messages import (
    INLINE_MEDIA_MAX_BYTES,
    EncodeBatch,
    EncodeJob,
    MediaRef,
    SamplingParams,
    Timing,
)
from coordinator.submit import inline_bytes
from encode_node.worker import EncodeWorker

BINARY = bytes(range(256)) * 3  # every byte value: not UTF-8, so JSON must carry it encoded


def _job(request_id: str, media: list[MediaRef]) -> EncodeJob:
    return EncodeJob(request_id=request_id, prompt_token_ids=[1, 2], sampling=SamplingParams(), arrival=0.0,
                     timing=Timing(marks={}), media=media)


def test_only_small_media_are_inlined():
    assert inline_bytes([]) is None
    assert inline_bytes([("image", b"a"), ("image", b"bc")]) == [b"a", b"bc"]
    assert inline_bytes([("image", bytes(INLINE_MEDIA_MAX_BYTES))]) is not None
    assert inline_bytes([("image", bytes(INLINE_MEDIA_MAX_BYTES // 2 + 1))] * 2) is None  # the request's total


def test_the_first_run_carries_the_bytes_and_a_rerun_reads_the_keys():
    refs = [MediaRef(key="k0"), MediaRef(key="k1")]
    flight = Flight("r", [1], SamplingParams(), refs, 0.0, inline=[BINARY, b"x"])
    assert [r.data for r in flight.encode_media()] == [BINARY, b"x"]
    assert [r.key for r in flight.encode_media()] == ["k0", "k1"]
    flight.attempt = 1
    assert [r.data for r in flight.encode_media()] == [None, None]
    assert [r.data for r in Flight("r", [1], SamplingParams(), refs, 0.0).encode_media()] == [None, None]
    assert "k0" in repr(refs[0]) and "data" not in repr(flight.encode_media()[0])  # never in a log line


def test_inline_bytes_survive_the_job_stream_exactly():
    batch = EncodeBatch(jobs=[_job("r", [MediaRef(key="k", data=BINARY), MediaRef(key="k2")])])
    back = EncodeBatch.model_validate_json(batch.model_dump_json())
    assert back.jobs[0].media[0].data == BINARY and back.jobs[0].media[1].data is None


@pytest.mark.redis
def test_the_encoder_reads_inline_bytes_and_fetches_the_rest(redis_url, key_prefix):
    """Real Redis: an inline job is served from the job even with no key stored; a keyed job from its key; a
    keyed job whose key expired is None (the worker answers it 'media expired'), in one batch, in order."""
    stored = os.urandom(1000)

    async def go():
        r = aioredis.Redis.from_url(redis_url)
        try:
            await r.set(f"{key_prefix}:m1", stored)
            jobs = [_job("a", [MediaRef(key=f"{key_prefix}:absent-a", data=BINARY)]),
                    _job("b", [MediaRef(key=f"{key_prefix}:m1")]),
                    _job("c", [MediaRef(key=f"{key_prefix}:absent-c")]),
                    _job("d", [MediaRef(key=f"{key_prefix}:m1"), MediaRef(key=f"{key_prefix}:x", data=b"y")])]
            return await EncodeWorker.fetch_media(SimpleNamespace(redis=r), jobs)
        finally:
            await r.aclose()

    assert asyncio.run(go()) == [[BINARY], [stored], None, [stored, b"y"]]
