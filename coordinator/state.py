"""What the lifespan opens and the routes use, handed to routes through a FastAPI dependency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis

from coordinator.config import CoordinatorConfig
from coordinator.dispatch import EncodeDispatcher
from coordinator.flights import FlightBook
from coordinator.metrics import Metrics
from coordinator.policies.base import PolicyConfig
from coordinator.prompt import PromptBuilder
from coordinator.protocol.keys import Keys
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.routing_view import RoutingView


@dataclass
class AppState:
    config: CoordinatorConfig
    redis: Redis
    keys: Keys
    registry: WorkerRegistry
    dispatcher: EncodeDispatcher
    prompts: PromptBuilder
    metrics: Metrics
    started_at: float
    policy: PolicyConfig
    """The knobs in force; the dispatcher holds the batch part, workers read the rest from Redis."""
    reply_key: str = ""
    """This coordinator process's reply stream (Keys.replies of its instance): every job names it."""
    reply_addr: str = ""
    """host:port of this coordinator's direct reply link listener (reply_listener.py), every job names it too;
    empty when it has none (config.direct_links off, or no cluster secret off loopback)."""
    flights: FlightBook = field(default_factory=FlightBook)
    """The requests in flight here (what the failover re-runs)."""
    counter: int = 0
    routing: RoutingView = field(init=False)
    """The registry as dispatch reads it: one scan serves the requests of a few milliseconds (routing_view.py)."""

    def __post_init__(self) -> None:
        self.routing = RoutingView(self.registry)


def get_state(request: Request) -> AppState:
    return request.app.state.tierserve


State = Annotated[AppState, Depends(get_state)]
