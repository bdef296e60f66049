"""The real coordinator app in this process, its lifespan run, reached through httpx (and the openai client)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import openai

from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.protocol.models import DEFAULT_MODEL_NAME

BASE_URL = "http://127.0.0.1:8000"
"""A loopback Host, as a client of a local coordinator sends it."""


@asynccontextmanager
async def app_client(redis_url: str, key_prefix: str, **config):
    """(app, client): the app built from `config` on a real Redis, its lifespan open for the block."""
    app = create_app(CoordinatorConfig(redis_url=redis_url, key_prefix=key_prefix, **config))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE_URL, timeout=30) as client:
            yield app, client


def openai_client(client: httpx.AsyncClient, api_key: str = "none") -> openai.AsyncOpenAI:
    """The official client over the same in-process transport; no retries, so a 429 surfaces at once."""
    return openai.AsyncOpenAI(api_key=api_key, base_url=f"{BASE_URL}/v1", http_client=client, max_retries=0)


def chat_body(model: str = DEFAULT_MODEL_NAME, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, **extra}
