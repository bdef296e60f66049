"""Run-time policy knobs: `GET/PUT /v1/admin/policy`, so the planner applies a configuration without restarts."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from coordinator.errors import RequestError
from coordinator.policies.base import BatchPolicyConfig
from coordinator.state import AppState, State

router = APIRouter()


class PolicyUpdate(BaseModel):
    """Fields to change; the rest keep their current values."""

    model_config = ConfigDict(extra="forbid")

    batch: dict | None = None
    """Any BatchPolicyConfig fields (name, max_batch, fill_probability, max_wait_s, ...)."""


def _authorize(state: AppState, request: Request) -> None:
    token = state.config.admin_token
    if token is None:
        return
    given = request.headers.get("authorization", "").removeprefix("Bearer ")
    if not hmac.compare_digest(given, token):
        raise RequestError("admin endpoints need `Authorization: Bearer <--admin-token>`", status=401,
                           code="unauthorized")


def _current(state: AppState) -> dict:
    return {"batch": state.dispatcher.config.model_dump()}


@router.get("/v1/admin/policy")
async def get_policy(request: Request, state: State) -> dict:
    _authorize(state, request)
    return _current(state)


@router.put("/v1/admin/policy")
async def put_policy(request: Request, state: State) -> dict:
    _authorize(state, request)
    try:
        update = PolicyUpdate.model_validate_json(await request.body())
        batch = BatchPolicyConfig.model_validate({**state.dispatcher.config.model_dump(), **(update.batch or {})})
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise RequestError(f"{loc}: {first['msg']}", param=loc or None) from None
    await state.dispatcher.reconfigure(batch)
    await state.redis.set(state.keys.policy, batch.model_dump_json())
    return _current(state)
