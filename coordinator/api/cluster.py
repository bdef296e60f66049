"""Read-only endpoints: health, the model list, the worker registry, Prometheus metrics.

/health and /metrics stay open (load balancers and Prometheus carry no key); the /v1 ones need an API key."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coordinator.api.openapi import CLUSTER_RESPONSES, HEALTH_RESPONSES, MODELS_RESPONSES, REDIS_DOWN
from coordinator.api.schema import ErrorResponse, ModelCard, ModelList
from coordinator.auth import ApiKey
from coordinator.errors import RequestError
from coordinator.state import State

router = APIRouter()


@router.get("/health", responses=HEALTH_RESPONSES)
async def health(state: State) -> JSONResponse:
    try:
        await state.redis.ping()
    except Exception as e:
        return JSONResponse({"status": "unhealthy", "redis": f"unreachable: {e}"}, status_code=503)
    workers = await state.registry.alive()
    roles = sorted({w.info.role for w in workers})
    return JSONResponse({"status": "ok", "redis": "ok", "workers": len(workers), "roles": roles})


@router.head("/health", include_in_schema=False)
async def health_head(state: State) -> Response:
    """GET's status without its body, for load balancers that probe with HEAD."""
    return Response(status_code=(await health(state)).status_code)


@router.get("/v1/models", dependencies=[ApiKey], response_model=ModelList, responses=MODELS_RESPONSES)
async def models(state: State) -> dict:
    return {"object": "list", "data": [{
        "id": state.config.model_name, "object": "model", "created": int(state.started_at), "owned_by": "tierserve",
    }]}


@router.get("/v1/models/{model:path}", dependencies=[ApiKey], response_model=ModelCard,
            responses={**MODELS_RESPONSES, 404: {"model": ErrorResponse, "description": "not the model served here"}})
async def model(model: str, state: State) -> dict:
    """OpenAI's retrieve-model route (`client.models.retrieve`)."""
    listed = await models(state)
    if model != state.config.model_name:
        raise RequestError(f"model '{model}' is not served here; GET /v1/models lists '{state.config.model_name}'",
                           param="model", status=404, code="model_not_found")
    return listed["data"][0]


@router.get("/v1/cluster", dependencies=[ApiKey], responses=CLUSTER_RESPONSES)
async def cluster(state: State) -> dict:
    # Requests in flight here whose current holder is each worker (what a failure of it would re-run).
    holding: dict[str, int] = {}
    for f in state.flights:
        if f.holder is not None and not f.done:
            holding[f.holder.worker_id] = holding.get(f.holder.worker_id, 0) + 1
    workers = await state.registry.alive()
    return {"workers": [{
        "worker_id": w.info.worker_id, "role": w.info.role, "tier": w.info.tier, "host": w.info.host,
        "pid": w.info.pid, "model": w.info.model, "load": w.load, "colocated_with": w.info.colocated_with,
        "device": w.info.device, "gpu_telemetry": w.info.gpu_telemetry,
        "stats": w.stats,
        "heartbeat_age_s": round(w.heartbeat_age_s, 3), "uptime_s": round(time.time() - w.info.started_at, 1),
        "holding": holding.get(w.info.worker_id, 0),
    } for w in workers]}


@router.get("/metrics", response_class=PlainTextResponse, responses=REDIS_DOWN)
async def metrics(request: Request, state: State) -> Response:
    """The coordinator's own metrics, plus what each live worker reported with its last heartbeat."""
    m = state.metrics
    admission = getattr(request.app.state, "admission", None)
    if admission is not None:
        for what in ("in_flight", "admitted", "rejected"):
            m.admission.labels(what).set(getattr(admission, what))
    m.flights.set(len(state.flights))
    m.worker_load.clear()
    m.worker_stat.clear()
    for w in await state.registry.alive():
        m.worker_load.labels(w.info.worker_id, w.info.role).set(w.load)
        for stat, value in w.stats.items():
            m.worker_stat.labels(w.info.worker_id, stat).set(value)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
