"""The coordinator's FastAPI app: factory + lifespan; routes live in coordinator/api/."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.admission import Admission, AdmissionStats
from coordinator.auth import has_api_key
from coordinator.config import CoordinatorConfig
from coordinator.dispatch import EncodeDispatcher
from coordinator.errors import RequestError
from coordinator.failover import Failover
from coordinator.metrics import Metrics
from coordinator.oserve.flight_watch import MonitoredFlightBook
from coordinator.oserve.monitor import WorkloadMonitor
from coordinator.oserve.monitor_loop import WorkloadGauges, run_monitor
from coordinator.policies.registry import make_batch_policy
from coordinator.protocol import envs
from coordinator.protocol.aborts import listen_channel
from coordinator.protocol.keys import Keys
from coordinator.protocol.links import Links
from coordinator.protocol.process import cancel_and_wait
from coordinator.protocol.registry import WorkerRegistry
from coordinator.protocol.streams import append_jobs
from coordinator.redis_client import dedicated_client, open_redis
from coordinator.replies import read_replies
from coordinator.reply_listener import open_listener
from coordinator.state import AppState

log = logging.getLogger(__name__)
SHUTDOWN_WAIT_S = 2.0


REDIS_RETRY_AFTER_S = 2
"""Retry-After on a 503 from a Redis error: about a Redis restart's or a failover's length."""


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

        client = redis or open_redis(config.redis_url, config.max_in_flight)
        await client.ping()
        keys = Keys(config.key_prefix)
        metrics = Metrics()
        reply_key = keys.replies(uuid.uuid4().hex[:12])
        secret = envs.cluster_secret()
        job_links = Links(lambda entries: append_jobs(client, entries), reply_key, secret) if config.direct_links else None
        dispatcher = EncodeDispatcher(client, keys, config.policy.batch, make_batch_policy, metrics, links=job_links)
        monitor = app.state.monitor = WorkloadMonitor(client, config.key_prefix)  # OServe: GET /v1/admin/workload
        app.state.tierserve = AppState(
            config=config, redis=client, keys=keys,
            registry=WorkerRegistry(client, keys, config.heartbeat_ttl_s), dispatcher=dispatcher,
            prompts=PromptBuilder.from_model_dir(config.model_dir, MediaLimits(
                max_image_bytes=config.max_image_bytes, max_images_per_request=config.max_images_per_request,
                max_image_pixels=config.max_image_pixels, allowed_local_dirs=config.allowed_local_dirs,
                max_video_frames=config.max_video_frames, max_video_bytes=config.max_video_bytes,
                max_videos_per_request=config.max_videos_per_request, max_audio_bytes=config.max_audio_bytes,
                max_audio_seconds=config.max_audio_seconds, max_audios_per_request=config.max_audios_per_request),
                max_prompt_chars=config.max_prompt_chars),
            metrics=metrics, started_at=time.time(), policy=config.policy,
            reply_key=reply_key, flights=MonitoredFlightBook(monitor),
        )
        state = app.state.tierserve
        await client.set(keys.policy, config.policy.model_dump_json())
        failover = Failover(state)
        await failover.start()
        count_frame = lambda path: metrics.link_writes.labels("reply", path).inc()  # noqa: E731
        listener = await open_listener(config, state.flights, state.reply_key, secret, count_frame)
        state.reply_addr = listener.address if listener is not None else ""
        reader = dedicated_client(client)  # its blocking XREAD never waits on, or holds, a pooled connection
        tasks = [asyncio.create_task(listen_channel(client, keys.encoder_idle, dispatcher.encoder_idle, "encoder-idle")),
                 asyncio.create_task(read_replies(reader, state.reply_key, state.flights, on_frame=count_frame)),
                 asyncio.create_task(failover.run()),
                 asyncio.create_task(state.routing.keep_fresh()),
                 asyncio.create_task(run_monitor(monitor, WorkloadGauges(metrics.registry), lambda: len(state.flights),
                                                 lambda: sum(len(q) for q in dispatcher.queues.values())))]
        # Everything loaded so far (transformers, the processor, the app: ~0.5 M objects) lives as long as the
        # process: out of the collector's sight, a full collection takes ~1 ms instead of ~0.4 s, and the
        # collections that request garbage triggers stop costing the coordinator a large share of its CPU.
        gc.freeze()
        log.info("coordinator ready", extra={"prefix": config.key_prefix, "replies": state.reply_key,
                                              "reply_link": state.reply_addr})
        try:
            yield
        finally:
            # A read cancelled mid-reply can leave its connection closing slowly: never let it hold up shutdown.
            await cancel_and_wait(tasks, SHUTDOWN_WAIT_S)
            if listener is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(listener.close(), SHUTDOWN_WAIT_S)
            dispatcher.close()
            if job_links is not None:  # what a link did not ack goes onto the streams
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(job_links.close(), SHUTDOWN_WAIT_S)
            # Every step is bounded: a Redis that stopped answering must not hold a shutdown forever.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(failover.close(), SHUTDOWN_WAIT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.aclose(), SHUTDOWN_WAIT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.delete(state.reply_key), SHUTDOWN_WAIT_S)
            if redis is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.aclose(), SHUTDOWN_WAIT_S)
            gc.unfreeze()  # an app built again in the same process (tests) must not pile up frozen garbage

    app = FastAPI(title="tierserve coordinator", version="0.1.0", lifespan=lifespan)
    app.state.admission = AdmissionStats()
    app.add_middleware(Admission, limit=config.max_in_flight, stats=app.state.admission,
                       counts=lambda scope: has_api_key(scope, config.api_keys))

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
        # coordinator.auth raises with OpenAI's whole body as the detail; Starlette's own (404, 405) carry text
        body = exc.detail if isinstance(exc.detail, dict) else error_body(
            str(exc.detail), type_="not_found_error" if exc.status_code == 404 else "invalid_request_error")
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RedisError)
    async def redis_error(_: Request, exc: RedisError) -> JSONResponse:
        # Redis down, restarting, or every pooled connection busy past the pool's wait: the request did not
        # fail on its merits, so it is the server's to retry (503), never a 500.
        log.warning("a request failed on Redis: %r", exc)  # the details (address) go to the log, not the client
        return JSONResponse(error_body(
            f"the coordinator cannot reach its Redis ({type(exc).__name__}); retry in a few seconds, and if "
            "this persists check that the cluster's Redis is up (GET /health says)", type_="server_error",
            code="redis_unavailable"), status_code=503, headers={"Retry-After": str(REDIS_RETRY_AFTER_S)})

    from coordinator.api import admin, chat, cluster
    from coordinator.api.openapi import CHAT_RESPONSES, describe_chat
    from coordinator.auth import ApiKey

    app.include_router(admin.router)
    app.include_router(cluster.router)
    app.include_router(chat.router, dependencies=[ApiKey], responses=CHAT_RESPONSES)

    @app.head("/metrics", include_in_schema=False)
    async def metrics_head() -> Response:
        """200 and no body: probes (load balancers, benchmark clients) check the endpoint before scraping it."""
        return Response(media_type=CONTENT_TYPE_LATEST)

    app.openapi = lambda: app.openapi_schema or describe_chat(app)
    return app
