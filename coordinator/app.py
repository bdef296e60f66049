"""The coordinator's FastAPI app: factory + lifespan; routes live in coordinator/api/."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.asyncio import Redis
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.config import CoordinatorConfig
from coordinator.dispatch import EncodeDispatcher
from coordinator.errors import RequestError
from coordinator.metrics import Metrics
from coordinator.policies.registry import make_batch_policy
from coordinator.protocol.aborts import listen_channel
from coordinator.protocol.keys import Keys
from coordinator.protocol.registry import WorkerRegistry
from coordinator.state import AppState

log = logging.getLogger(__name__)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape, which its clients turn into typed exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def create_app(config: CoordinatorConfig, redis: Redis | None = None) -> FastAPI:
    """`redis` may be injected (tests); otherwise the lifespan opens one from `config.redis_url`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from coordinator.media import MediaLimits
        from coordinator.prompt import PromptBuilder

        client = redis or Redis.from_url(config.redis_url)
        await client.ping()
        keys = Keys(config.key_prefix)
        metrics = Metrics()
        dispatcher = EncodeDispatcher(client, keys, config.policy.batch, make_batch_policy, metrics)
        app.state.tierserve = AppState(
            config=config, redis=client, keys=keys,
            registry=WorkerRegistry(client, keys, config.heartbeat_ttl_s), dispatcher=dispatcher,
            prompts=PromptBuilder.from_model_dir(config.model_dir, MediaLimits(
                max_image_bytes=config.max_image_bytes, max_images_per_request=config.max_images_per_request,
                max_image_pixels=config.max_image_pixels, allowed_local_dirs=config.allowed_local_dirs,
                max_video_frames=config.max_video_frames, max_video_bytes=config.max_video_bytes,
                max_videos_per_request=config.max_videos_per_request, max_audio_bytes=config.max_audio_bytes,
                max_audio_seconds=config.max_audio_seconds, max_audios_per_request=config.max_audios_per_request)),
            metrics=metrics, started_at=time.time(), policy=config.policy,
        )
        await client.set(keys.policy, config.policy.model_dump_json())
        idle = asyncio.create_task(listen_channel(client, keys.encoder_idle, dispatcher.encoder_idle, "encoder-idle"))
        log.info("coordinator ready", extra={"redis": config.redis_url, "prefix": config.key_prefix})
        try:
            yield
        finally:
            idle.cancel()
            await asyncio.gather(idle, return_exceptions=True)
            dispatcher.close()
            if redis is None:
                await client.aclose()

    app = FastAPI(title="tierserve coordinator", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, param=exc.param, code=exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse(error_body(f"{loc}: {first.get('msg', 'invalid request')}", param=loc or None),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), type_="not_found_error" if exc.status_code == 404
                                       else "invalid_request_error"), status_code=exc.status_code)

    from coordinator.api import admin, chat, cluster

    app.include_router(admin.router)
    app.include_router(cluster.router)
    app.include_router(chat.router)
    return app
