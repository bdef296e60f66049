"""Read-only endpoints: health, the model list, the worker registry, Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coordinator.state import State

router = APIRouter()


@router.get("/health")
async def health(state: State) -> JSONResponse:
    try:
        await state.redis.ping()
    except Exception as e:
        return JSONResponse({"status": "unhealthy", "redis": f"unreachable: {e}"}, status_code=503)
    workers = await state.registry.alive()
    roles = sorted({w.info.role for w in workers})
    return JSONResponse({"status": "ok", "redis": "ok", "workers": len(workers), "roles": roles})


@router.get("/v1/models")
async def models(state: State) -> dict:
    return {"object": "list", "data": [{
        "id": state.config.model_name, "object": "model", "created": int(state.started_at), "owned_by": "tierserve",
    }]}


@router.get("/v1/cluster")
async def cluster(state: State) -> dict:
    workers = await state.registry.alive()
    return {"workers": [{
        "worker_id": w.info.worker_id, "role": w.info.role, "tier": w.info.tier, "host": w.info.host,
        "pid": w.info.pid, "model": w.info.model, "load": w.load, "colocated_with": w.info.colocated_with,
        "stats": w.stats,
        "heartbeat_age_s": round(w.heartbeat_age_s, 3), "uptime_s": round(time.time() - w.info.started_at, 1),
    } for w in workers]}


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """The coordinator's own metrics, plus what each live worker reported with its last heartbeat."""
    m = state.metrics
    m.worker_load.clear()
    m.worker_stat.clear()
    for w in await state.registry.alive():
        m.worker_load.labels(w.info.worker_id, w.info.role).set(w.load)
        for stat, value in w.stats.items():
            m.worker_stat.labels(w.info.worker_id, stat).set(value)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
