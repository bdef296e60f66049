"""When a request's worker dies and no other can take it, the client gets an explicit error within 5 s
(never a 120 s timeout), streaming or not, and the reason names what happened."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from benchmarks.faults.inject import kill9, wait_until_holding
from benchmarks.faults.load import request_body, send
from cluster_factory import serve_cluster

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.long]


@pytest.fixture
def lone_llm(redis_url, tmp_path):
    """One encode and one combined worker, nobody restarting what dies."""
    yield from serve_cluster(tmp_path, encode_workers=1, llm_roles=["combined"], redis_url=redis_url)


def test_no_worker_left_is_an_explicit_error_within_5s(lone_llm):
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            req = asyncio.create_task(send(client, lone_llm.url, request_body(lone_llm.spec.model_name, 1,
                                                                             max_tokens=1000), 60))
            assert await asyncio.to_thread(wait_until_holding, lone_llm, "llm-0-combined", 20.0)
            killed = time.monotonic()
            kill9(lone_llm, "llm-0-combined")
            status, text, error, _ = await req
            return status, text, error, time.monotonic() - killed

    status, text, error, took = asyncio.run(go())
    print(f"\nexplicit error {took:.2f} s after the kill: {error}")
    # The re-run is encoded again, and the encoder finds no LLM worker to hand it to.
    assert error is not None and "no prefill or combined LLM worker is alive" in error
    assert took <= 5.0
