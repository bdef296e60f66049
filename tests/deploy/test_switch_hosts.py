"""`tierserve deploy switch` end to end: a live plan switch on three network-namespace hosts under load.

h1 runs Redis, the coordinator and a combined worker; h2 an encode worker; h3 is a spare host of group encode
that `tierserve deploy up` prepares and gives nothing to run. Under a steady load of image requests the cluster
switches from 1 E + 1 P+D to 2 E + 1 P+D: the new encode worker must go to h3 (the least-loaded encode host),
register, be released and take requests; then back, retiring it. Every request must be served with the model's
own answer, the switch time (the request to the new layout serving) is measured, the inventory is rewritten
so that a second `up` changes nothing, and the plan's policy is in force. Skipped like test_multihost_e2e.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from plan_file_factory import small_plan
from test_multihost_e2e import (  # noqa: F401 (hosts and expected are fixtures)
    MAX_TOKENS,
    MODEL,
    POLICY,
    RUN_LIMIT_S,
    TIERSERVE,
    _answers_match,
    _changed,
    _cluster,
    _deploy,
    _inventory,
    _url,
    expected,
    hosts,
)

from benchmarks.faults.load import SteadyLoad, counts
from coordinator.deploy.inventory_file import InventoryFile
from coordinator.planner.planfile import PlanFile
from coordinator.protocol.keys import Keys

pytestmark = [pytest.mark.slow, pytest.mark.multihost, pytest.mark.long, pytest.mark.timeout(900)]  # ~200 s
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "swh"
RATE = 1.0


def plan_of(base: PlanFile, roles: list[str], max_batch: int) -> PlanFile:
    nodes = [{"host": "node0", "gpu_index": i, "tier": "RTX4090", "role": r} for i, r in enumerate(roles)]
    policy = POLICY.model_dump(mode="json")
    policy["batch"]["max_batch"] = max_batch
    return PlanFile.model_validate(base.model_dump(mode="json") | {"nodes": nodes, "policy": policy})


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    """(inventory, wheel, Redis client): deployed, and brought down whatever happens."""
    from coordinator.deploy.runner import build_wheel

    work = tmp_path_factory.mktemp("switch")
    wheel = build_wheel(work / "dist")
    doc = _inventory(hosts, "tcp")
    hv, children = doc["all"]["hosts"], doc["all"]["children"]
    hv["h1"]["llm_node_workers"] = [{"id": "h1-combined", "role": "combined", "gpu": 0, "tier": "cpu"}]
    del hv["h3"]["llm_node_workers"]
    doc["all"]["vars"]["tierserve_key_prefix"] = PREFIX
    children["encode"] = {"hosts": {"h2": {}, "h3": {}}}
    children["llm"] = {"children": {"combined": {"hosts": {"h1": {}}}}}
    inventory = work / "cluster.yml"
    inventory.write_text(yaml.safe_dump(doc))
    client = None
    try:
        rc, out = _deploy("up", inventory, "--wheel", str(wheel))
        assert rc == 0, out[-6000:]
        secrets = yaml.safe_load(inventory.with_name("cluster.secrets.yml").read_text())
        client = redis.Redis.from_url(InventoryFile.load(inventory).redis_url(secrets["tierserve_redis_password"]))
        yield inventory, wheel, client
    finally:
        if client is not None:
            client.close()
        _deploy("down", inventory)


def _switch_under_load(url: str, inventory: Path, plan: Path, expected: dict[int, str]) -> tuple[int, str, list]:
    """`tierserve deploy switch` while a steady load runs: (exit status, output, the load's outcomes)."""
    result: dict = {}
    finished = threading.Event()

    def switch() -> None:
        try:
            r = subprocess.run([TIERSERVE, "deploy", "switch", str(plan), "-i", str(inventory)], capture_output=True,
                               text=True, timeout=RUN_LIMIT_S, cwd=ROOT)
            result["out"] = (r.returncode, r.stdout + r.stderr)
        finally:
            finished.set()

    async def load() -> list:
        stop = asyncio.Event()
        steady = SteadyLoad(url, MODEL, expected, rate=RATE, max_tokens=MAX_TOKENS, timeout_s=90)
        task = asyncio.create_task(steady.run(stop, max_requests=600))
        await asyncio.sleep(2)
        threading.Thread(target=switch, daemon=True).start()
        while not finished.is_set():
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # the new layout serves a while under the same load
        stop.set()
        return await task

    outcomes = asyncio.run(load())
    rc, out = result.get("out", (-1, "the switch did not run"))
    return rc, out, outcomes


def _switch_s(out: str) -> float:
    m = re.search(r"serving: .*?([\d.]+) s after the request", out)
    assert m, out[-4000:]
    return float(m[1])


def test_switch_to_one_more_encoder_and_back_under_load(hosts, cluster, expected, tmp_path):
    inventory, wheel, client = cluster
    url = _url(hosts)
    h3 = hosts.hosts[2]
    wide, narrow = tmp_path / "wide.yaml", tmp_path / "narrow.yaml"
    base = small_plan()
    wide.write_text(plan_of(base, ["E", "E", "P+D"], max_batch=2).to_yaml())
    narrow.write_text(plan_of(base, ["E", "P+D"], max_batch=4).to_yaml())
    admin = yaml.safe_load(inventory.with_name("cluster.secrets.yml").read_text())["tierserve_admin_token"]
    auth = {"Authorization": f"Bearer {admin}"}
    assert sorted(_cluster(hosts)) == ["h1-combined", "h2-encode"]

    t0 = time.monotonic()
    rc, out, outcomes = _switch_under_load(url, inventory, wide, expected)
    wall_one = time.monotonic() - t0
    c = counts(outcomes)
    print(f"\nswitch to 2 E + 1 P+D under {RATE} req/s: {_switch_s(out):.1f} s to serving; requests {c}\n{out}")
    assert rc == 0, out[-6000:]
    assert c["sent"] >= 10 and c["served"] == c["sent"], ([o for o in outcomes if o.kind != "served"], c)
    workers = _cluster(hosts)
    assert sorted(workers) == ["encode-0", "h1-combined", "h2-encode"]
    assert workers["encode-0"]["pid"] in hosts.pids(h3), "the new encoder runs on h3, the least-loaded encode host"
    assert all(kind == "served" for kind, _ in _answers_match(hosts, expected))  # a burst spreads over both
    jobs = client.xinfo_stream(Keys(PREFIX).jobs("encode-0"))
    assert jobs["entries-added"] > 0, jobs  # routed: the dispatcher gave it micro-batches
    assert not client.smembers(Keys(PREFIX).warming)
    state = httpx.get(f"{url}/v1/admin/plan", headers=auth, timeout=10).json()
    assert state["switch"]["phase"] == "done" and [u["role"] for u in state["current"]["layout"]] == ["E", "P+D", "E"]
    policy = httpx.get(f"{url}/v1/admin/policy", headers=auth, timeout=10).json()
    assert policy["batch"]["max_batch"] == 2
    inv = InventoryFile.load(inventory)
    assert [w["id"] for w in inv.host_vars("h3")["encode_node_workers"]] == ["encode-0"]
    assert inv.all["vars"]["tierserve_policy"]["batch"]["max_batch"] == 2

    t1 = time.monotonic()
    # the rewritten inventory is the cluster as it runs: `up` on the host that changed changes nothing
    rc, up = _deploy("up", inventory, "--wheel", str(wheel), "--limit", h3.name)
    assert rc == 0 and _changed(up) == {h3.name: 0}, (_changed(up), up[-6000:])
    up_s = time.monotonic() - t1

    rc, out, outcomes = _switch_under_load(url, inventory, narrow, expected)
    c = counts(outcomes)
    print(f"switch back to 1 E + 1 P+D: {_switch_s(out):.1f} s to serving; requests {c}; first switch "
          f"{wall_one:.0f} s wall with its load, `up --limit h3` {up_s:.0f} s\n{out}")
    assert rc == 0, out[-6000:]
    assert c["sent"] >= 5 and c["served"] == c["sent"], ([o for o in outcomes if o.kind != "served"], c)
    assert sorted(_cluster(hosts)) == ["h1-combined", "h2-encode"]
    assert "encode_node_workers" not in InventoryFile.load(inventory).host_vars("h3")
    assert not [p for p in hosts.processes(h3) if "encode_node" in p]
    policy = httpx.get(f"{url}/v1/admin/policy", headers=auth, timeout=10).json()
    assert policy["batch"]["max_batch"] == 4
