"""1,000 requests at once against a cluster that admits 256: each is answered 200 or 429 (with Retry-After,
in OpenAI's shape), none is lost, the Redis connection pool never turns the burst into 500s, and no request
leaves a key behind in Redis."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis

from cluster_factory import serve_cluster
from media_factory import data_url, image_bytes

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.long]
N = 1000


@pytest.fixture(scope="module")
def small_cluster(redis_url, tmp_path_factory):
    yield from serve_cluster(tmp_path_factory.mktemp("overload-logs"), encode_workers=1, llm_roles=["combined"],
                             redis_url=redis_url)


def _body(i: int) -> dict:
    content: list | str = f"request {i}: say something"
    if i % 2:
        content = [{"type": "image_url", "image_url": {"url": data_url(image_bytes(i % 7, 32, 32))}},
                   {"type": "text", "text": f"request {i}"}]
    return {"model": "tiny-llava", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def _request_keys(url: str, prefix: str) -> list[bytes]:
    r = redis.Redis.from_url(url)
    try:
        return [k for pattern in ("media", "tok") for k in r.scan_iter(f"{prefix}:{pattern}:*", count=1000)]
    finally:
        r.close()


def test_a_thousand_at_once_get_200_or_429_and_leave_no_keys(small_cluster, redis_url):
    before = _request_keys(redis_url, small_cluster.spec.key_prefix)

    async def burst():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=N)) as client:
            async def one(i):
                try:
                    r = await client.post(f"{small_cluster.url}/v1/chat/completions", json=_body(i))
                    return r.status_code, r.headers.get("retry-after"), r.json()
                except (httpx.HTTPError, ValueError) as e:
                    return None, None, repr(e)
            return await asyncio.gather(*(one(i) for i in range(N)))

    t0 = time.monotonic()
    answers = asyncio.run(burst())
    took = time.monotonic() - t0
    statuses = [s for s, _, _ in answers]
    counts = {s: statuses.count(s) for s in set(statuses)}
    print(f"\n{N} concurrent requests in {took:.1f} s: {counts}")
    assert set(counts) <= {200, 429}, [a for a in answers if a[0] not in (200, 429)][:3]
    assert counts.get(200, 0) >= 256  # at least the bound was admitted
    throttled = [a for a in answers if a[0] == 429]
    assert throttled, "the burst never reached the in-flight bound"
    assert all(ra and int(ra) >= 1 for _, ra, _ in throttled)
    assert all(body["error"]["code"] == "rate_limit_exceeded" for _, _, body in throttled)
    assert all(body["choices"][0]["message"]["content"] is not None for s, _, body in answers if s == 200)
    time.sleep(0.5)
    assert len(_request_keys(redis_url, small_cluster.spec.key_prefix)) <= len(before)
