"""Back-pressure in the real app: a bounded number of chat requests in flight (429 + Retry-After beyond it),
a Redis pool that waits instead of raising, and a Redis outage answered 503, never 500.

Requests are held in flight by uploading their bodies slowly, as a slow client does: admission counts a
request from its arrival, so a half-sent body holds its slot. (A streaming answer holding its slot needs
live workers: tests/integration/test_admission_live.py.)
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from live_app import app_client, chat_body, openai_client
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from coordinator.protocol.process import cancel_and_wait
from coordinator.redis_client import POOL_HEADROOM, open_redis
from coordinator.redis_server import PrivateRedis

pytestmark = pytest.mark.redis

LIMIT = 4


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def slow_upload(body: dict, release: asyncio.Event):
    """A request body whose second half is sent only once `release` is set."""
    data = json.dumps(body).encode()

    async def chunks():
        yield data[: len(data) // 2]
        await release.wait()
        yield data[len(data) // 2:]
    return chunks()


async def test_beyond_the_limit_is_429_with_retry_after_then_admitted_again(redis_url, key_prefix):
    release = asyncio.Event()
    async with app_client(redis_url, key_prefix, max_in_flight=LIMIT) as (app, client):
        stats = app.state.admission
        held = [asyncio.create_task(client.post("/v1/chat/completions", content=slow_upload(
            chat_body(model="not-served"), release))) for _ in range(LIMIT)]
        await until(lambda: stats.in_flight == LIMIT)

        r = await client.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "requests", "param": None,
                                      "code": "rate_limit_exceeded"}}
        assert "--max-in-flight" in r.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError) as e:
            await openai_client(client).chat.completions.create(**chat_body())
        assert e.value.code == "rate_limit_exceeded" and e.value.response.headers["retry-after"] == "1"
        # what admission does not count stays answerable under full load, and /metrics says how full it is
        assert (await client.get("/health")).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert f'tierserve_admission{{what="in_flight"}} {float(LIMIT)}' in metrics
        assert 'tierserve_admission{what="rejected"} 2.0' in metrics
        assert (await client.get("/v1/models")).status_code == 200

        release.set()
        assert [(await t).status_code for t in held] == [404] * LIMIT  # each was served once its body came
        assert stats.in_flight == 0 and stats.rejected == 2
        r = await client.post("/v1/chat/completions", json=chat_body(model="not-served"))
        assert r.status_code == 404  # admitted again: answered on its merits


async def test_a_client_that_leaves_mid_upload_frees_its_slot(redis_url, key_prefix):
    release = asyncio.Event()
    async with app_client(redis_url, key_prefix, max_in_flight=1) as (app, client):
        held = asyncio.create_task(client.post("/v1/chat/completions", content=slow_upload(chat_body(), release)))
        await until(lambda: app.state.admission.in_flight == 1)
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 429
        assert not await cancel_and_wait([held], 5.0)
        await until(lambda: app.state.admission.in_flight == 0)
        assert (await client.post("/v1/chat/completions", json=chat_body(model="x"))).status_code == 404


async def test_the_pool_waits_for_a_connection_instead_of_raising(redis_url, key_prefix):
    """300 requests against a pool capped at 100 were 201 HTTP 500s: a plain pool raises at its cap."""
    size = 1 + POOL_HEADROOM
    blocked = f"{key_prefix}:never-pushed"
    plain = Redis.from_url(redis_url, max_connections=size)
    try:
        with pytest.raises(RedisConnectionError, match="Too many connections"):
            await asyncio.gather(*(plain.blpop([blocked], timeout=0.2) for _ in range(3 * size)))
    finally:
        await plain.aclose()
    sized = open_redis(redis_url, max_in_flight=1)
    try:
        assert isinstance(sized.connection_pool, BlockingConnectionPool)
        assert sized.connection_pool.max_connections == size
        assert await asyncio.gather(*(sized.blpop([blocked], timeout=0.1) for _ in range(3 * size))) == [None] * 3 * size
    finally:
        await sized.aclose()


async def test_the_app_sizes_its_pool_to_the_admission_bound(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix, max_in_flight=40) as (app, _):
        pool = app.state.tierserve.redis.connection_pool
        assert isinstance(pool, BlockingConnectionPool) and pool.max_connections == 40 + POOL_HEADROOM


async def test_a_redis_outage_is_503_with_retry_after_never_500(key_prefix):
    server = PrivateRedis().start()
    try:
        async with app_client(server.url, key_prefix) as (_, client):
            assert (await client.get("/v1/cluster")).status_code == 200
            server.stop()
            calls = [("GET", "/v1/cluster", None), ("GET", "/v1/models", None),
                     ("POST", "/v1/chat/completions", chat_body()),
                     ("PUT", "/v1/admin/policy", {"batch": {"max_batch": 2}}), ("GET", "/metrics", None)]
            # Together: each rides out the client's bounded reconnect retries (about 3.6 s) before its 503.
            answers = await asyncio.gather(*(client.request(m, p, json=b) for m, p, b in calls))
            for (_, path, _), r in zip(calls, answers):
                if path == "/v1/models":  # needs no Redis: still served
                    assert r.status_code == 200
                    continue
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.headers["retry-after"] == "2"
                error = r.json()["error"]
                assert error["type"] == "server_error" and error["code"] == "redis_unavailable"
                assert "retry" in error["message"] and "Redis" in error["message"]
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    finally:
        server.stop()


async def test_a_request_without_a_valid_key_is_401_at_full_load_and_holds_no_slot(redis_url, key_prefix):
    """Admission counts only requests with a valid key: a wrong or missing key gets its 401 even when every slot
    is taken (never a 429 the client would retry), and never takes a slot from a keyed client."""
    release = asyncio.Event()
    good = {"Authorization": "Bearer key-1"}
    async with app_client(redis_url, key_prefix, max_in_flight=2, api_keys=("key-1",)) as (app, client):
        stats = app.state.admission
        held = [asyncio.create_task(client.post("/v1/chat/completions", headers=good, content=slow_upload(
            chat_body(model="not-served"), release))) for _ in range(2)]
        await until(lambda: stats.in_flight == 2)
        for headers in ({"Authorization": "Bearer wrong-key-123"}, {}, {"Authorization": "Basic key-1"}):
            r = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert r.status_code == 401, (headers, r.status_code, r.text)
        assert (stats.in_flight, stats.rejected) == (2, 0)
        r = await client.post("/v1/chat/completions", json=chat_body(), headers=good)
        assert r.status_code == 429  # a keyed request over the limit is still refused
        release.set()
        assert {(await t).status_code for t in held} == {404}  # "not-served": admitted, then refused by model
        assert stats.in_flight == 0
