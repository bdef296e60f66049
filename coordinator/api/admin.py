"""Run-time policy knobs: `GET/PUT /v1/admin/policy`, so the planner applies a configuration without restarts.

The batch policy lives in this coordinator's dispatcher; every knob is also stored under
`{prefix}:policy`, where the encode workers read theirs (offload share s, work stealing, SM partition)
within a second. The admin token (or, without one, a loopback Host) guards both (coordinator.auth).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from coordinator.api.openapi import ADMIN_RESPONSES
from coordinator.auth import AdminAuth
from coordinator.errors import RequestError
from coordinator.policies.base import PolicyConfig
from coordinator.state import State

router = APIRouter(dependencies=[AdminAuth], responses=ADMIN_RESPONSES)


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


@router.get("/v1/admin/policy")
async def get_policy(state: State) -> dict:
    return state.policy.model_dump()


@router.put("/v1/admin/policy", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": PolicyUpdate.model_json_schema()}}}})  # the route parses its body itself
async def put_policy(request: Request, state: State) -> dict:
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


@router.get("/v1/admin/workload")
async def get_workload(request: Request, window: str = "60") -> dict:
    """OServe's monitor: the last `window` seconds of per-second counters (all coordinators of the cluster), and
    their summary: arrival rate and modality mix, tokens per request, goodput against the SLO in force."""
    monitor = request.app.state.monitor
    try:
        seconds = int(window)
        data = await monitor.window(seconds)
    except ValueError:
        raise RequestError(f"window must be a whole number of seconds from 1 to {monitor.config.retention_s} "
                           f"(the monitor's retention), got {window!r}", param="window") from None
    return {"window_s": data.seconds, "until": data.until, "slo": monitor.slo.model_dump(),
            "summary": data.summary(), "per_second": data.per_second}


@router.get("/v1/admin/plan")
async def get_plan(state: State) -> dict:
    """The plan in force with its worker layout, the switch in progress (or the last one) and who applies plans."""
    from coordinator.oserve.control import plan_state
    from coordinator.oserve.keys import OServeKeys

    return await plan_state(state.redis, OServeKeys(state.config.key_prefix))


@router.put("/v1/admin/plan", status_code=202, openapi_extra={"requestBody": {"required": True, "content": {
    "application/yaml": {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}}}})
async def put_plan(request: Request, state: State) -> dict:
    """Switch the running cluster to a plan file (YAML or JSON, as `tierserve plan` writes it): new workers start
    and register, then the old ones drain and stop, then the plan's knobs are put in force. 202 with the switch;
    409 when no executor runs the cluster or a switch is in progress."""
    import yaml

    from coordinator.oserve.control import PlanConflict, request_plan
    from coordinator.oserve.keys import OServeKeys
    from coordinator.planner.planfile import PlanFile

    try:
        doc = yaml.safe_load(await request.body())  # JSON is YAML
        if not isinstance(doc, dict):
            raise RequestError("the body must be a plan file (a YAML or JSON mapping), as `tierserve plan` writes it")
        plan = PlanFile.model_validate(doc)
    except yaml.YAMLError as e:
        raise RequestError(f"the body is not valid YAML or JSON: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise RequestError(f"plan file {loc or '(top level)'}: {first['msg']}", param=loc or None) from None
    try:
        status = await request_plan(state.redis, OServeKeys(state.config.key_prefix), plan)
    except PlanConflict as e:
        raise RequestError(str(e), status=409, code="plan_conflict") from None
    return status.model_dump()
