"""Shared fixtures: a real Redis (the local server, or a private one), a unique key prefix per test."""

from __future__ import annotations

import socket
import uuid

import pytest

from coordinator.redis_server import PrivateRedis


def _local_redis_answers(port: int = 6379) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url():
    """127.0.0.1:6379 db 0 when it answers (CI starts one); else a private redis-server for the session."""
    if _local_redis_answers():
        yield "redis://127.0.0.1:6379/0"
        return
    server = PrivateRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


def _purge(url: str, prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    try:
        keys = list(r.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


@pytest.fixture
def key_prefix(redis_url):
    """A fresh namespace; every key under it is deleted after the test."""
    prefix = f"tstest-{uuid.uuid4().hex[:10]}"
    yield prefix
    _purge(redis_url, prefix)


@pytest.fixture(scope="module")
def module_prefix(redis_url):
    prefix = f"tstest-{uuid.uuid4().hex[:10]}"
    yield prefix
    _purge(redis_url, prefix)


def logit_mismatches(name: str, ref_tokens: list[int], ref_logits: list, tokens: list[int], logits: list,
                     atol: float = 1e-4) -> list[str]:
    """Every way `tokens`/`logits` differ from a generate() reference; [] when they match.

    The one comparator of the exactness tests and their negative controls: tokens must be equal and
    every step's logits within `atol` (greedy tokens alone miss position bugs).
    """
    problems = []
    if tokens != ref_tokens:
        problems.append(f"{name}: tokens {tokens} != reference {ref_tokens}")
    if len(logits) != len(ref_logits):
        problems.append(f"{name}: {len(logits)} logit steps != reference {len(ref_logits)}")
    for i, (got, want) in enumerate(zip(logits, ref_logits)):
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
        if not diff < atol:
            problems.append(f"{name}: step {i} logits max-abs-diff {diff:.3g} >= {atol}")
    return problems


@pytest.fixture
def logit_compare():
    return logit_mismatches
