"""A small live cluster (1 encode + 1 combined worker, tiny LLaVA) shared by the planner's live tests:
profiling, replay and the live trial backend."""

from __future__ import annotations

import uuid

import pytest

from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port


@pytest.fixture(scope="session")
def live_cluster(redis_url, tmp_path_factory):
    import redis

    prefix = f"tstest-{uuid.uuid4().hex[:10]}"
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], redis_url=redis_url, key_prefix=prefix,
                       port=free_port())
    cluster = LocalCluster(spec, tmp_path_factory.mktemp("planner-cluster-logs"))
    cluster.start(timeout_s=180)
    try:
        yield cluster
    finally:
        cluster.stop()
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
