"""Plans in Redis between the admin endpoint and the executor: what is in force, what is asked, how it goes.

PUT /v1/admin/plan (coordinator) validates a plan file and stores it as desired; `PlanControl.tick`, called
from the supervisor loop of `tierserve up`, picks it up, runs the PlanSwitch through its Executor, reports
the switch's status at every change and, once done, records the new plan and layout as current and puts the
plan's policy knobs in force. The executor also keeps a short-lived key alive, so the endpoint can refuse a
plan (409) when nobody would apply it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable

import redis
from pydantic import BaseModel
from redis.asyncio import Redis as AsyncRedis

from coordinator.oserve.keys import OServeKeys
from coordinator.oserve.layout import Namer, Unit, diff
from coordinator.oserve.switch import Executor, PlanSwitch, SwitchStatus
from coordinator.planner.planfile import PlanFile

log = logging.getLogger(__name__)
EXECUTOR_TTL_MS = 5000


class PlanRecord(BaseModel):
    """A plan and the layout it runs as (current), or a plan asked for (desired)."""

    id: str
    plan: dict | None = None
    """The plan file (JSON form); None for a cluster started without one."""
    layout: list[Unit] = []
    at: float
    """When it was put in force (current) or asked for (desired), wall clock."""


class PlanConflict(Exception):
    """The plan cannot be taken now (no executor, a switch in progress); the message says why."""


async def request_plan(r: AsyncRedis, keys: OServeKeys, plan: PlanFile) -> SwitchStatus:
    """Store `plan` as desired (the executor starts the switch within a tick); PlanConflict if it cannot."""
    executor = await r.get(keys.plan_executor)
    if executor is None:
        raise PlanConflict("no executor applies plans to this cluster (it is started by `tierserve up`; a bare "
                           "`tierserve serve` cannot start workers); start the cluster with tierserve up")
    raw = await r.get(keys.plan_switch)
    if raw and SwitchStatus.model_validate_json(raw).phase in ("requested", "starting", "retiring"):
        raise PlanConflict("a plan switch is in progress (GET /v1/admin/plan shows it); retry once it is done")
    rec = PlanRecord(id=uuid.uuid4().hex[:12], plan=plan.model_dump(mode="json"), at=time.time())
    status = SwitchStatus(id=rec.id, phase="requested", requested_at=rec.at,
                          change=f"to {len(plan.nodes)} GPUs: " + ", ".join(n.role for n in plan.nodes))
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.plan_desired, rec.model_dump_json())
    pipe.set(keys.plan_switch, status.model_dump_json())
    await pipe.execute()
    return status


async def plan_state(r: AsyncRedis, keys: OServeKeys) -> dict:
    """GET /v1/admin/plan: the plan in force, the switch in progress or last done, the executor."""
    current, switch, executor = await r.mget(keys.plan_current, keys.plan_switch, keys.plan_executor)
    return {"current": json.loads(current) if current else None, "switch": json.loads(switch) if switch else None,
            "executor": executor.decode() if isinstance(executor, bytes) else executor}


class PlanControl:
    """The executor's side: call `tick()` every fraction of a second from the supervisor loop."""

    def __init__(self, client: redis.Redis, prefix: str, executor: Executor, layout: list[Unit],
                 names: Callable[[], set[str]], apply_policy: Callable[[dict], None] | None = None,
                 plan: PlanFile | None = None, name: str = "local", clock: Callable[[], float] = time.time,
                 start_timeout_s: float = 180.0) -> None:
        self.redis, self.keys, self.executor = client, OServeKeys(prefix), executor
        self.layout, self.names, self.apply_policy = layout, names, apply_policy
        self.name, self.clock, self.start_timeout_s = name, clock, start_timeout_s
        self.switch: PlanSwitch | None = None
        self._handled: str | None = None
        self._beat = 0.0
        self._write_current(PlanRecord(id="initial", plan=plan.model_dump(mode="json") if plan else None,
                                       layout=layout, at=clock()))
        self.redis.delete(self.keys.plan_desired, self.keys.plan_switch)

    def _write_current(self, rec: PlanRecord) -> None:
        self.redis.set(self.keys.plan_current, rec.model_dump_json())

    def tick(self) -> None:
        now = self.clock()
        if now - self._beat >= 1.0:
            self.redis.set(self.keys.plan_executor, self.name, px=EXECUTOR_TTL_MS)
            self._beat = now
        if self.switch is None:
            raw = self.redis.get(self.keys.plan_desired)
            if raw is None:
                return
            rec = PlanRecord.model_validate_json(raw)
            if rec.id == self._handled:
                return
            self._handled = rec.id
            target = PlanFile.model_validate(rec.plan)
            change = diff(self.layout, [n.role for n in target.nodes])
            self.switch = PlanSwitch(rec.id, change, self.executor, Namer(set(self.names())), rec.at, self.clock,
                                     self.start_timeout_s)
            self._target = rec
            log.info("plan switch", extra={"id": rec.id, "change": change.describe()})
        stepped, sw = self.switch.step(), self.switch
        if sw.finished:  # the plan in force first: a reader that sees "done" must see the new current plan
            self._finish()
        if stepped or sw.finished:
            self.redis.set(self.keys.plan_switch, sw.status.model_dump_json())

    def _finish(self) -> None:
        sw, rec = self.switch, self._target
        self.switch = None
        self.redis.delete(self.keys.plan_desired)
        if sw.status.phase == "failed":
            log.error("plan switch failed", extra={"id": rec.id, "error": sw.status.error})
            return
        self.layout = sw.layout()
        self._write_current(PlanRecord(id=rec.id, plan=rec.plan, layout=self.layout, at=self.clock()))
        if self.apply_policy is not None and rec.plan is not None:
            try:
                self.apply_policy(rec.plan["policy"])
            except Exception as e:  # the layout is in force; the knobs can be PUT again by hand
                log.error("the new plan's policy was not applied", extra={"error": str(e)})
        log.info("plan in force", extra={"id": rec.id, "switch_s": sw.status.switch_s})
