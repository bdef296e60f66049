"""The coordinator's Redis client, its connection pool sized to the admission bound."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

from coordinator.protocol.process import RETRIES

POOL_HEADROOM = 32
"""Connections beyond one per admitted request: the lifespan's long-lived readers (encoder-idle subscription,
reply stream), the dispatcher's flushes, /health, /metrics, /v1/cluster and the admin API, which admission
does not count."""
POOL_WAIT_S = 5.0
"""How long a command waits for a free connection before redis-py raises ConnectionError (answered 503)."""
CONNECT_TIMEOUT_S = 5.0
"""A Redis host that drops packets fails a request in this long instead of hanging it."""


def dedicated_client(client: Redis) -> Redis:
    """A client of the same server with a pool of its own (one connection), for a long blocking read."""
    pool = client.connection_pool
    return Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class, max_connections=2,
                                                **pool.connection_kwargs))


def open_redis(url: str, max_in_flight: int) -> Redis:
    """A client whose pool holds `max_in_flight + POOL_HEADROOM` connections and, when all are busy, waits
    for one to come free: a plain pool raises at its cap (100 by default), which turned a burst of 300
    requests into 201 HTTP 500s. An admitted request uses at most about one connection at a time, so the
    bound on requests bounds the connections too, and a wait longer than POOL_WAIT_S is answered 503."""
    pool = BlockingConnectionPool.from_url(url, max_connections=max_in_flight + POOL_HEADROOM, timeout=POOL_WAIT_S,
                                           socket_connect_timeout=CONNECT_TIMEOUT_S, retry=Retry(
                                               ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
                                           retry_on_error=[ConnectionError, TimeoutError])
    return Redis.from_pool(pool)
