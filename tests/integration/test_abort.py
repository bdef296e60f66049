"""A client that goes away mid-stream stops the work: the workers abort the request."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from coordinator.protocol.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _llm_load(cluster) -> int:
    workers = httpx.get(f"{cluster.url}/v1/cluster", timeout=5).json()["workers"]
    return sum(w["load"] for w in workers if w["role"] != "encode")


def test_disconnect_aborts_generation(cluster):
    body = {"model": "tiny-llava", "stream": True, "max_tokens": 1500, "temperature": 0,
            "messages": [{"role": "user", "content": "count to a thousand"}]}
    with httpx.stream("POST", f"{cluster.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any('"content"' in line for line in got)
    # Without the abort, 1500 tokens would keep the worker busy (and its token stream growing) for seconds.
    key = Keys(cluster.spec.key_prefix).tokens(rid)
    r = redis.Redis.from_url(cluster.redis_url)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_llm_load(cluster) > 0 or r.exists(key)):
            time.sleep(0.25)
        assert _llm_load(cluster) == 0
        first = r.xlen(key)
        time.sleep(1.0)
        # The coordinator deleted the stream when the client left; at most the step in flight then may
        # have written to it. A generation that went on would have written up to 1500 events.
        assert r.xlen(key) == first <= 2, "tokens kept coming after the client left"
        assert first == 0 or r.ttl(key) > 0, "a token stream outlived its reader without a TTL"
    finally:
        r.close()


def test_non_streaming_client_that_gives_up_aborts_generation(cluster):
    body = {"model": "tiny-llava", "max_tokens": 1500, "temperature": 0,
            "messages": [{"role": "user", "content": "count to a thousand, again"}]}
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=1.5))
    # Busy until the coordinator notices (polled every 0.25 s) and the abort reaches the worker;
    # 1500 tokens would keep it busy far longer than this on any machine this suite runs on.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and _llm_load(cluster) > 0:
        time.sleep(0.25)
    if _llm_load(cluster) != 0:  # seen once in a full-suite run, never alone: keep what explains it
        workers = httpx.get(f"{cluster.url}/v1/cluster", timeout=5).json()["workers"]
        logs = "\n".join(f"--- {n}\n{cluster.tail(n, 15)}" for n in cluster.procs if "llm" in n or n == "coordinator")
        pytest.fail(f"the worker kept generating for a client that left {time.monotonic() - t0:.1f}s ago; "
                    f"workers: {workers}\n{logs}")
    metrics = httpx.get(f"{cluster.url}/metrics", timeout=5).text
    assert 'tierserve_requests_total{outcome="disconnected"}' in metrics, time.monotonic() - t0
