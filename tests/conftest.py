"""Shared fixtures: a real Redis (the local server, or a private one), a unique key prefix per test."""

from __future__ import annotations

import socket
import uuid

import pytest

from coordinator.redis_server import PrivateRedis
from logit_check import logit_mismatches


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


@pytest.fixture
def logit_compare():
    return logit_mismatches


_LONG_LEFT: list[str] = []


def pytest_deselected(items):
    """Remember the `long` tests a `-m "not long"` run leaves out, so the summary can say so."""
    _LONG_LEFT.extend(item.nodeid for item in items if item.get_closest_marker("long") is not None)


def pytest_terminal_summary(terminalreporter):
    if _LONG_LEFT:
        modules = sorted({nodeid.split("::")[0] for nodeid in _LONG_LEFT})
        terminalreporter.write_line(
            f"{len(_LONG_LEFT)} tests marked long were not run here ({', '.join(m.rsplit('/', 1)[-1] for m in modules)}):"
            " `make test-long` runs them, and CI runs it after `make test`.", yellow=True, bold=True)
