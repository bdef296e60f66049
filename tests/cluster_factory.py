"""Real local clusters for the integration tests: each under its own Redis key prefix, cleaned up after."""

from __future__ import annotations

import uuid

import redis

from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port


def serve_cluster(logs, **spec):
    """Start a cluster under a fresh key prefix, yield it, then stop it and delete its Redis keys."""
    prefix = f"tstest-{uuid.uuid4().hex[:10]}"
    c = LocalCluster(ClusterSpec(key_prefix=prefix, port=free_port(), **spec), logs)
    c.start(timeout_s=180)
    try:
        yield c
    finally:
        c.stop()
        r = redis.Redis.from_url(spec["redis_url"])
        keys = list(r.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
