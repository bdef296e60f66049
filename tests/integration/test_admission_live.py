"""Admission on a real coordinator process (`python -m coordinator.serve --max-in-flight 4`) in front of the
live test cluster's workers: a streaming answer holds its slot until its stream ends or its client leaves.

Slots are filled with slow uploads (a half-sent body is in flight), and probed with a request naming an
unserved model: admitted, it is answered 404 at once; refused, 429.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from coordinator.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]

LIMIT = 4


@pytest.fixture(scope="module")
def coordinator(cluster):
    """A second coordinator on the cluster's key prefix, admitting at most LIMIT chat requests."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERSERVE_")}
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.serve", "--redis-url", cluster.redis_url,
                             "--key-prefix", cluster.spec.key_prefix, "--port", str(port),
                             "--max-in-flight", str(LIMIT)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the coordinator did not answer /health within 90 s"
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def hold(url: str, n: int) -> list[socket.socket]:
    """`n` chat requests whose bodies are half sent: each holds an admission slot until finished."""
    body = json.dumps({"model": "unserved", "messages": [{"role": "user", "content": "hi"}]}).encode()
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(body), body[:10]))
        socks.append(s)
    return socks


def probe(url: str) -> int:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "unserved", "messages": []}).status_code


def until_status(url: str, status: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := probe(url)) != status:
        assert time.monotonic() < deadline, f"probe answered {got}, expected {status}"
        time.sleep(0.05)


def stream(url: str, served: str, max_tokens: int):
    client = openai.OpenAI(api_key="none", base_url=f"{url}/v1", max_retries=0)
    return client.chat.completions.create(model=served, messages=[{"role": "user", "content": "Count to a thousand"}],
                                          max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})


def test_a_stream_holds_its_slot_until_it_ends(coordinator):
    served = httpx.get(f"{coordinator}/v1/models").json()["data"][0]["id"]
    held = hold(coordinator, LIMIT - 1)
    try:
        until_status(coordinator, 404)  # one slot left: the probe takes it and leaves
        chunks = stream(coordinator, served, max_tokens=400)
        first = next(iter(chunks))
        assert first.choices[0].delta.role == "assistant"
        assert probe(coordinator) == 429  # the stream holds the last slot
        with pytest.raises(openai.RateLimitError) as e:
            openai.OpenAI(api_key="none", base_url=f"{coordinator}/v1", max_retries=0).chat.completions.create(
                model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.response.headers["retry-after"] == "1"
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finish[-1] == "length"
        until_status(coordinator, 404)  # the stream ended: its slot is free again
    finally:
        for s in held:
            s.close()
    until_status(coordinator, 404)


def test_a_stream_whose_client_leaves_frees_its_slot(coordinator):
    served = httpx.get(f"{coordinator}/v1/models").json()["data"][0]["id"]
    held = hold(coordinator, LIMIT - 1)
    try:
        until_status(coordinator, 404)
        chunks = stream(coordinator, served, max_tokens=1500)
        next(iter(chunks))
        assert probe(coordinator) == 429
        chunks.close()  # the client leaves long before 1500 tokens
        until_status(coordinator, 404, timeout_s=5)
    finally:
        for s in held:
            s.close()
