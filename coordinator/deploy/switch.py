"""`tierserve deploy switch NEW_PLAN.yaml -i INVENTORY`: a deployed cluster switched live to another plan's layout.

The layout in force is the one the last switch recorded in Redis (`{prefix}:plan:current`, as `tierserve up`'s
PlanControl keeps it) when it lists the inventory's workers, else the inventory's own. For the length of the
command this process is the cluster's plan executor: PlanControl (coordinator/oserve/control.py) runs the
PlanSwitch with a HostExecutor, the plan is asked for the way PUT /v1/admin/plan asks (so GET /v1/admin/plan
shows the switch), new workers start on hosts through deploy/worker.yml held out of routing, are released
together once all are registered, then the old ones drain and stop (decode workers last). Once done the plan is
recorded as in force, its policy PUT to /v1/admin/policy and written to the inventory beside the new workers,
so that `tierserve deploy up` reproduces the result.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
import yaml
from pydantic import ValidationError

from coordinator.deploy.hosts import DeployError
from coordinator.deploy.inventory_file import InventoryFile, WorkerDefaults
from coordinator.deploy.runner import Playbook, ansible_playbook
from coordinator.oserve.control import PlanConflict, PlanControl, PlanRecord, request_plan
from coordinator.oserve.host_executor import HostExecutor, HostExecutorError
from coordinator.oserve.keys import OServeKeys
from coordinator.oserve.layout import Unit
from coordinator.oserve.switch import PlanSwitch
from coordinator.plan_launch import check_engine
from coordinator.planner.planfile import PlanFile, PlanFileError, load_plan

EXECUTOR_NAME = "tierserve deploy switch"
"""What GET /v1/admin/plan shows as the executor while the command runs."""
POLL_S = 0.5


@dataclass(frozen=True)
class SwitchOptions:
    plan: Path
    inventory: Path
    secrets: Path
    playbooks: Path
    log_dir: Path
    start_timeout_s: float = 600.0
    """New workers not registered by then are stopped, and the old layout stays."""
    playbook_timeout_s: float = 900.0
    """A worker's ansible-playbook run still going after this is killed and counts as failed."""


def layout_in_force(client: redis.Redis, keys: OServeKeys, inventory: InventoryFile) -> tuple[list[Unit], PlanFile | None]:
    """The units in force and their plan: the recorded ones when they are the inventory's workers, else the
    inventory's own (a cluster never switched, or an inventory edited and re-deployed since)."""
    units = inventory.units()
    raw = client.get(keys.plan_current)
    if raw:
        rec = PlanRecord.model_validate_json(raw)
        if sorted(w for u in rec.layout for w in u.workers) == sorted(w for u in units for w in u.workers):
            try:
                return rec.layout, PlanFile.model_validate(rec.plan) if rec.plan else None
            except ValidationError:
                return rec.layout, None
    return units, None


class Progress:
    """One line per phase of the switch, with the seconds since the command began."""

    def __init__(self, executor: HostExecutor, t0: float) -> None:
        self.executor, self.t0, self.said = executor, t0, set()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    def update(self, sw: PlanSwitch) -> None:
        s = sw.status
        events = [("starting", s.phase != "requested",
                   lambda: "starting: " + (", ".join(f"{w} on {self.executor.hosts.get(w, '?')}" for w in s.starting)
                                           or "nothing") + f" ({s.change})"),
                  ("serving", s.serving_at is not None,
                   lambda: f"serving: the new layout is registered and routed, {s.switch_s:.1f} s after the "
                           f"request; retiring: {', '.join(s.retiring) or 'nothing'}"),
                  ("done", s.phase == "done", lambda: "done: every retired worker has drained and stopped"),
                  ("failed", s.phase == "failed", lambda: f"failed: {s.error}")]
        for name, due, text in events:
            if due and name not in self.said:
                self.said.add(name)
                self.say(text())


def _plan(path: Path) -> PlanFile:
    try:
        plan = load_plan(path)
        check_engine(plan)
    except PlanFileError as e:
        raise DeployError(str(e)) from None
    return plan


def _secrets(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text()) or {}
    missing = [n for n in ("tierserve_redis_password", "tierserve_admin_token") if not doc.get(n)]
    if missing:
        raise DeployError(f"secrets file {path} lacks {', '.join(missing)} (`tierserve deploy up` writes them)")
    return doc


def _connect(inventory: InventoryFile, password: str) -> redis.Redis:
    url = inventory.redis_url(password)
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
    try:
        client.ping()
    except redis.RedisError as e:
        raise DeployError(f"cannot reach the cluster's Redis at {url.split('@', 1)[1]}: {e}; is the cluster up "
                          f"(`tierserve deploy up -i {inventory.path}`)?") from None
    return client


async def _ask(url: str, keys: OServeKeys, plan: PlanFile) -> None:
    from redis.asyncio import Redis as AsyncRedis

    r = AsyncRedis.from_url(url)
    try:
        await request_plan(r, keys, plan)
    finally:
        await r.aclose()


def switch(o: SwitchOptions) -> int:
    """Run the switch to completion; 0 when done with the policy in force, 1 when it failed (what stays is
    said), DeployError on bad input."""
    plan, secrets = _plan(o.plan), _secrets(o.secrets)
    inventory = InventoryFile.load(o.inventory)
    ansible_playbook()  # installed, or a DeployError that says how
    client = _connect(inventory, secrets["tierserve_redis_password"])
    keys = OServeKeys(inventory.key_prefix)
    holder = client.get(keys.plan_executor)
    if holder is not None:
        raise DeployError(f"{holder.decode()!r} applies plans to this cluster now (GET /v1/admin/plan shows its "
                          f"switch); run this once it is done")
    layout, previous = layout_in_force(client, keys, inventory)
    book = Playbook(o.inventory.resolve(), o.playbooks.resolve(), o.secrets.resolve())
    executor = HostExecutor(inventory, book, client, WorkerDefaults.from_plan(plan), o.log_dir, o.playbook_timeout_s)
    policy_error: list[str] = []
    token = secrets["tierserve_admin_token"]

    def apply_policy(policy: dict) -> None:
        inventory.set_plan(plan)
        inventory.save()
        try:
            httpx.put(f"{inventory.coordinator_url()}/v1/admin/policy", json=policy, timeout=10,
                      headers={"Authorization": f"Bearer {token}"}).raise_for_status()
        except httpx.HTTPError as e:
            policy_error.append(f"{type(e).__name__}: {e}")
            raise

    control = PlanControl(client, inventory.key_prefix, executor, layout, executor.names, apply_policy, previous,
                          name=EXECUTOR_NAME, start_timeout_s=o.start_timeout_s)
    progress = Progress(executor, time.monotonic())
    progress.say(f"switching {o.inventory} to {o.plan} ({len(plan.nodes)} GPUs: "
                 f"{', '.join(n.role for n in plan.nodes)}); playbook logs in {o.log_dir}")
    sw: PlanSwitch | None = None
    try:
        control.tick()
        try:
            asyncio.run(_ask(inventory.redis_url(secrets["tierserve_redis_password"]), keys, plan))
        except PlanConflict as e:
            raise DeployError(str(e)) from None
        while sw is None or not sw.finished:
            control.tick()
            sw = sw or control.switch
            if sw is None:
                raise DeployError("the plan asked for was not taken (another executor cleared it); run this again")
            progress.update(sw)
            if sw.status.phase == "starting" and any(w in executor.failures for w in sw.status.starting):
                for w in sw.status.starting:
                    if w in executor.failures:
                        progress.say(f"cannot start {w}: {executor.failures[w]}")
                sw.start_timeout_s = 0.0  # it will never register: fail the switch now (it stops the new workers)
            time.sleep(POLL_S)
        progress.update(sw)
        while executor.busy:  # a failed switch's stops of the new workers
            executor.pump()
            time.sleep(POLL_S)
    except HostExecutorError as e:
        return _abandon(client, keys, sw, progress, f"{e}\nit is still in the inventory; run this command again to "
                                                   f"retire it, or stop it by hand")
    except KeyboardInterrupt:
        executor.abort()
        _abandon(client, keys, sw, progress, "interrupted: the playbooks in progress were stopped; the inventory "
                                             f"lists every worker that may run (`tierserve deploy up -i "
                                             f"{o.inventory}` makes that true)")
        return 130
    finally:
        client.delete(keys.plan_executor)  # nobody applies PUT /v1/admin/plan once this command ends
    if sw.status.phase == "failed":
        unstopped = [executor.failures[w] for w, (state, rc) in executor.outcome.items() if state == "absent" and rc]
        progress.say("the old layout stays" + ("; these new workers did not stop cleanly and are still in the "
                                               "inventory:\n" + "\n".join(unstopped) if unstopped else ""))
        return 1
    if policy_error:
        progress.say(f"the new layout is in force and recorded, its policy is not ({policy_error[0]}); "
                     f"`tierserve deploy up -i {o.inventory}` puts it in force")
        return 1
    progress.say(f"in force: plan {o.plan}, policy PUT; {o.inventory} lists {len(inventory.workers())} workers "
                 f"(`tierserve deploy up` reproduces them); switch {sw.status.switch_s:.1f} s to serving")
    return 0


def _abandon(client: redis.Redis, keys: OServeKeys, sw: PlanSwitch | None, progress: Progress, why: str) -> int:
    """Mark the switch failed where GET /v1/admin/plan reads it, and say what is left."""
    if sw is not None and not sw.finished:
        sw.status.phase, sw.status.error, sw.status.done_at = "failed", why, time.time()
        client.set(keys.plan_switch, sw.status.model_dump_json())
    progress.say(f"failed: {why}")
    return 1
