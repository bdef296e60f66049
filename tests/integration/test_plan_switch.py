"""Live plan switching: a steady image load on a local CPU cluster while PUT /v1/admin/plan changes the worker
layout (1 E + 1 P+D -> 2 E + P + D, and back). Nothing may be lost, every answer must be the one the same
request gets with no switch (greedy), and the switch time (PUT -> the new layout serving) is measured."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import httpx
import pytest
import redis
from plan_file_factory import small_plan

from benchmarks.faults.load import SteadyLoad, counts, expected_answers
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.oserve.control import PlanControl
from coordinator.oserve.layout import local_units
from coordinator.oserve.local_executor import LocalExecutor
from coordinator.planner.planfile import PlanFile
from coordinator.policies.base import PolicyConfig
from coordinator.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.long]
IMAGES = [0, 1, 2, 3]
MAX_TOKENS = 24
RATE = 1.5
SWITCH_LIMIT_S = 240.0


def plan_of(base: PlanFile, roles: list[str]) -> PlanFile:
    nodes = [{"host": "node0", "gpu_index": i, "tier": "RTX4090", "role": r} for i, r in enumerate(roles)]
    return PlanFile.model_validate({**base.model_dump(mode="json"), "nodes": nodes,
                                    "policy": PolicyConfig().model_dump(mode="json")})


class ControlLoop:
    """Supervision and plan control every 0.1 s on one thread, as `tierserve up` runs them."""

    def __init__(self, cluster: LocalCluster, control: PlanControl) -> None:
        self.cluster, self.control, self.reports, self.errors = cluster, control, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cluster.supervise(self.reports.append)
                self.control.tick()
            except Exception as e:  # surfaced by the test
                self.errors.append(repr(e))
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def switching(redis_url, tmp_path):
    prefix = f"tstest-{uuid.uuid4().hex[:10]}"
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], redis_url=redis_url, key_prefix=prefix,
                       port=free_port(), drain_timeout_s=30)  # as `tierserve up`: the first layout drains too
    cluster = LocalCluster(spec, tmp_path / "logs").start(timeout_s=240)
    client = redis.Redis.from_url(redis_url)
    drain = ["--drain-timeout-s", "30"]
    executor = LocalExecutor(cluster, client, drain_timeout_s=40, llm_extra=drain, encode_extra=drain)
    control = PlanControl(client, prefix, executor, local_units(1, [frozenset()], ["combined"]), executor.names,
                          lambda policy: httpx.put(f"{cluster.url}/v1/admin/policy", json=policy, timeout=10))
    loop = ControlLoop(cluster, control)
    try:
        yield cluster, loop
    finally:
        loop.close()
        for name in list(executor.retiring):
            executor.stopped(name)
        cluster.stop()
        keys = list(client.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


async def switch_to(client: httpx.AsyncClient, url: str, plan: PlanFile) -> dict:
    r = await client.put(f"{url}/v1/admin/plan", content=plan.to_yaml(), headers={"Content-Type": "application/yaml"})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + SWITCH_LIMIT_S
    while time.monotonic() < deadline:
        state = (await client.get(f"{url}/v1/admin/plan")).json()
        if state["switch"]["phase"] in ("done", "failed"):
            return state
        await asyncio.sleep(0.5)
    raise AssertionError(f"switch not done within {SWITCH_LIMIT_S:.0f} s: {state}")


async def roles(client: httpx.AsyncClient, url: str) -> list[str]:
    return sorted(w["role"] for w in (await client.get(f"{url}/v1/cluster")).json()["workers"])


def test_switching_layouts_under_load_loses_nothing(switching):
    cluster, loop = switching
    base = small_plan()
    wide, narrow = plan_of(base, ["E", "E", "P", "D"]), plan_of(base, ["E", "P+D"])
    expected = asyncio.run(expected_answers(cluster.url, cluster.spec.model_name, IMAGES, MAX_TOKENS))

    async def go():
        load = SteadyLoad(cluster.url, cluster.spec.model_name, expected, rate=RATE, max_tokens=MAX_TOKENS)
        stop = asyncio.Event()
        running = asyncio.create_task(load.run(stop, max_requests=2000))
        async with httpx.AsyncClient(timeout=30) as client:
            conflict = None
            await asyncio.sleep(2.0)
            first = asyncio.create_task(switch_to(client, cluster.url, wide))
            await asyncio.sleep(1.0)
            if not first.done():
                conflict = await client.put(f"{cluster.url}/v1/admin/plan", content=narrow.to_yaml())
            one = await first
            after_one = await roles(client, cluster.url)
            await asyncio.sleep(2.0)
            two = await switch_to(client, cluster.url, narrow)
            after_two = await roles(client, cluster.url)
            await asyncio.sleep(2.0)
        stop.set()
        return await running, one, two, after_one, after_two, conflict

    outcomes, one, two, after_one, after_two, conflict = asyncio.run(go())
    tally = counts(outcomes)
    print(f"\nswitch 1 ({one['switch']['change']}): {one['switch']['switch_s']:.1f} s to serving, "
          f"{one['switch']['done_at'] - one['switch']['requested_at']:.1f} s to done")
    print(f"switch 2 ({two['switch']['change']}): {two['switch']['switch_s']:.1f} s to serving, "
          f"{two['switch']['done_at'] - two['switch']['requested_at']:.1f} s to done")
    print(f"requests: {tally}")
    assert not loop.errors, loop.errors
    assert one["switch"]["phase"] == two["switch"]["phase"] == "done", (one, two)
    assert after_one == ["decode", "encode", "encode", "prefill"] and after_two == ["combined", "encode"]
    assert [u["role"] for u in two["current"]["layout"]] == ["E", "P+D"]
    assert tally["lost"] == tally["wrong"] == tally["errored"] == 0, [o.detail for o in outcomes if o.kind != "served"]
    assert tally["served"] == len(outcomes) >= 20
    if conflict is not None:
        assert conflict.status_code == 409 and "in progress" in conflict.json()["error"]["message"]
    assert not any("not restarting" in r for r in loop.reports), loop.reports
