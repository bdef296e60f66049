"""What the lifespan opens and the routes use, handed to routes through a FastAPI dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis

from coordinator.config import CoordinatorConfig
from coordinator.dispatch import EncodeDispatcher
from coordinator.metrics import Metrics
from coordinator.policies.base import PolicyConfig
from coordinator.prompt import PromptBuilder
from coordinator.protocol.keys import Keys
from coordinator.protocol.registry import WorkerRegistry


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
    counter: int = 0


def get_state(request: Request) -> AppState:
    return request.app.state.tierserve


State = Annotated[AppState, Depends(get_state)]
