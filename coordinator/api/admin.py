"""Run-time policy knobs: `GET/PUT /v1/admin/policy`, so the planner applies a configuration without restarts.

The batch policy lives in this coordinator's dispatcher; every knob is also stored under
`{prefix}:policy`, where the encode workers read theirs (offload share s, work stealing, SM partition)
within a second.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from coordinator.errors import RequestError
from coordinator.policies.base import PolicyConfig
from coordinator.state import AppState, State

router = APIRouter()


class PolicyUpdate(BaseModel):
    """Fields to change; the rest keep their current values."""

    model_config = ConfigDict(extra="forbid")

    batch: dict | None = None
    """Any BatchPolicyConfig fields (name, max_batch, fill_probability, max_wait_s, ...)."""
    offload: dict | None = None
    """Any OffloadConfig fields (s)."""
    stealing: dict | None = None
    """Any WorkStealingConfig fields (enabled, max_stolen, remote_load_threshold, quiet_s)."""
    partition: dict | None = None
    """Any SMPartitionConfig fields (mode, static_encoder_fraction, min_share, ...)."""


def _authorize(state: AppState, request: Request) -> None:
    token = state.config.admin_token
    if token is None:
        return
    given = request.headers.get("authorization", "").removeprefix("Bearer ")
    if not hmac.compare_digest(given, token):
        raise RequestError("admin endpoints need `Authorization: Bearer <--admin-token>`", status=401,
                           code="unauthorized")


@router.get("/v1/admin/policy")
async def get_policy(request: Request, state: State) -> dict:
    _authorize(state, request)
    return state.policy.model_dump()


@router.put("/v1/admin/policy")
async def put_policy(request: Request, state: State) -> dict:
    _authorize(state, request)
    try:
        update = PolicyUpdate.model_validate_json(await request.body())
        current = state.policy.model_dump()
        policy = PolicyConfig.model_validate(
            {section: {**knobs, **(getattr(update, section) or {})} for section, knobs in current.items()})
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise RequestError(f"{loc}: {first['msg']}", param=loc or None) from None
    if policy.batch != state.policy.batch:
        await state.dispatcher.reconfigure(policy.batch)
    state.policy = policy
    await state.redis.set(state.keys.policy, policy.model_dump_json())
    return policy.model_dump()
