"""The host executor's inventory side, without hosts: which host a new worker goes to, the entry it gets, the
layout an inventory deploys, and the file written back (atomically, its header and mode kept, readable by
Ansible); and one real ansible-playbook run that fails, surfaced as a failed start."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
import yaml
from plan_file_factory import small_plan

from coordinator.deploy.hosts import DeployError, HostsFile
from coordinator.deploy.inventory import build_inventory
from coordinator.deploy.inventory_file import InventoryFile, WorkerDefaults
from coordinator.cli import main
from coordinator.deploy.runner import Playbook
from coordinator.deploy.switch import layout_in_force
from coordinator.oserve.control import PlanRecord
from coordinator.oserve.host_executor import HostExecutor, HostExecutorError
from coordinator.oserve.keys import OServeKeys
from coordinator.planner.planfile import PlanFile

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = WorkerDefaults(encode={"max_batch_size": 4}, llm={"max_num_seqs": 16})


def cluster() -> dict:
    """a: an encoder with its local prefill worker (GPU 0); b: two encoders; c: a decode worker (and Redis and
    the coordinator); d: a spare LLM host with one GPU."""
    return {"all": {
        "vars": {"tierserve_key_prefix": "hx", "tierserve_redis_port": 6390},
        "hosts": {
            "a": {"ansible_host": "10.0.0.1", "encode_node_workers": [
                      {"id": "a-e0", "gpu": 0, "tier": "RTX4090", "device": "cuda:0"}],
                  "llm_node_workers": [{"id": "a-p0", "role": "prefill", "gpu": 0, "tier": "RTX4090",
                                        "device": "cuda:0", "colocate_with": "a-e0"}]},
            "b": {"ansible_host": "10.0.0.2", "encode_node_workers": [
                      {"id": "b-e0", "gpu": 0, "tier": "RTX4090"}, {"id": "b-e1", "gpu": 1, "tier": "RTX4090"}]},
            "c": {"ansible_host": "10.0.0.3", "tierserve_advertise_address": "192.168.0.3", "llm_node_workers": [
                      {"id": "c-d0", "role": "decode", "gpu": 0, "tier": "A100-80GB", "dtype": "bfloat16"}]},
            "d": {"ansible_host": "10.0.0.4", "tierserve_gpus": 1},
        },
        "children": {"redis": {"hosts": {"c": {}}}, "coordinator": {"hosts": {"c": {}}},
                     "encode": {"hosts": {"a": {}, "b": {}}},
                     "llm": {"children": {"prefill": {"hosts": {"a": {}}}, "decode": {"hosts": {"c": {}}},
                                          "combined": {"hosts": {"d": None}}}}}}}


def test_the_layout_of_an_inventory_is_its_units():
    inv = InventoryFile(cluster())
    assert [(u.role, u.workers) for u in inv.units()] == [
        ("E+P", ("a-e0", "a-p0")), ("E", ("b-e0",)), ("E", ("b-e1",)), ("D", ("c-d0",))]
    assert inv.group("llm") == ["a", "c", "d"] and inv.group("encode") == ["a", "b"]
    assert inv.redis_url("pw") == "redis://:pw@192.168.0.3:6390/0" and inv.key_prefix == "hx"
    assert inv.coordinator_url() == "http://192.168.0.3:8000"


def test_a_written_inventory_deploys_its_plans_roles():
    plan = small_plan()
    nodes = [{"host": "node0", "gpu_index": 0, "tier": "RTX4090", "role": "E+P"},
             {"host": "node1", "gpu_index": 0, "tier": "RTX4090", "role": "E"},
             {"host": "node2", "gpu_index": 0, "tier": "A100-80GB", "role": "P"},
             {"host": "node2", "gpu_index": 1, "tier": "A100-80GB", "role": "D"}]
    plan = PlanFile.model_validate(plan.model_dump(mode="json") | {"nodes": nodes, "prices": {"RTX4090": 0.5, "A100-80GB": 3.67}})
    hosts = HostsFile.model_validate({"hosts": [
        {"name": "enc-1", "address": "10.0.0.11", "gpus": ["RTX4090"]},
        {"name": "enc-2", "address": "10.0.0.12", "gpus": ["RTX4090"]},
        {"name": "llm-1", "address": "10.0.0.21", "gpus": [{"tier": "A100", "count": 2}]}], "coordinator": "llm-1"})
    inv = InventoryFile(build_inventory(plan, hosts))
    assert Counter(u.role for u in inv.units()) == Counter(n.role for n in plan.nodes)
    defaults = WorkerDefaults.from_plan(plan)
    assert defaults.encode == {"max_batch_size": plan.policy.batch.max_batch}
    assert defaults.llm == {"max_num_seqs": plan.engine.max_num_seqs}
    vllm = PlanFile.model_validate(plan.model_dump(mode="json") | {"engine": plan.engine.model_dump() | {"kind": "vllm"}})
    assert WorkerDefaults.from_plan(vllm).llm["engine"] == "vllm"


def test_a_new_worker_goes_to_the_least_loaded_host_of_its_group_on_its_next_free_gpu():
    inv = InventoryFile(cluster())
    # a holds one GPU (encoder and local prefill share it), b two: a, on GPU 1, copying a's tier and device
    e = inv.place("encode-0", "encode", None, DEFAULTS)
    assert (e.host, e.entry) == ("a", {"id": "encode-0", "gpu": 1, "tier": "RTX4090", "device": "cuda:0",
                                       "max_batch_size": 4})
    # llm hosts a (2 GPUs now), c (1), d (0): d, copying the tier of an LLM worker with a GPU of its own
    c = inv.place("llm-0-combined", "combined", None, DEFAULTS)
    assert (c.host, c.entry) == ("d", {"id": "llm-0-combined", "role": "combined", "gpu": 0, "tier": "A100-80GB",
                                       "dtype": "bfloat16", "max_num_seqs": 16})
    # d is full (tierserve_gpus: 1): c, which joins group prefill
    p = inv.place("llm-1-prefill", "prefill", None, DEFAULTS)
    assert (p.host, p.entry["gpu"]) == ("c", 1) and "c" in inv.group("prefill")
    # sharing a GPU: the encoder's host and GPU, whatever the load
    inv.place("encode-1", "encode", None, DEFAULTS)
    assert inv.workers()["encode-1"].host == "b"
    local = inv.place("llm-local-1", "prefill", "encode-1", DEFAULTS)
    assert (local.host, local.entry["gpu"], local.entry["colocate_with"]) == ("b", 2, "encode-1")
    assert inv.group("prefill") == ["a", "c", "b"]
    assert [u.role for u in inv.units()][-4:] == ["E+P", "D", "P", "P+D"]


def test_placement_refusals_name_the_group_and_what_to_do():
    inv = InventoryFile(cluster())
    with pytest.raises(DeployError, match="already in the inventory"):
        inv.place("b-e0", "encode", None, DEFAULTS)
    with pytest.raises(DeployError, match="not in the inventory"):
        inv.place("llm-local-9", "prefill", "encode-9", DEFAULTS)
    doc = cluster()
    for host in ("a", "c"):
        doc["all"]["hosts"][host]["tierserve_gpus"] = 1
    inv = InventoryFile(doc)
    inv.place("x", "combined", None, DEFAULTS)  # d's one GPU
    with pytest.raises(DeployError, match="every host of group llm has all its GPUs"):
        inv.place("y", "combined", None, DEFAULTS)
    doc = cluster()
    del doc["all"]["children"]["encode"]
    with pytest.raises(DeployError, match="group encode has no host.*tierserve deploy up"):
        InventoryFile(doc).place("z", "encode", None, DEFAULTS)
    doc = cluster()
    doc["all"]["children"]["encode"]["hosts"]["b"] = {"encode_node_workers": []}
    with pytest.raises(DeployError, match="keep host variables under all.hosts"):
        InventoryFile(doc)


def test_the_inventory_is_written_back_atomically_and_ansible_reads_the_change(tmp_path):
    path = tmp_path / "cluster.yml"
    path.write_text("# tierserve inventory: plan p.yaml\n# deploy with: tierserve deploy up -i cluster.yml\n"
                    + yaml.safe_dump(cluster(), sort_keys=False))
    path.chmod(0o600)
    inv = InventoryFile.load(path)
    inv.place("llm-0-combined", "combined", None, DEFAULTS)
    inv.save()
    assert path.read_text().startswith("# tierserve inventory: plan p.yaml\n# deploy with:")
    assert path.stat().st_mode & 0o777 == 0o600 and [p.name for p in tmp_path.iterdir()] == ["cluster.yml"]
    again = InventoryFile.load(path)
    assert again.workers()["llm-0-combined"].host == "d" and again.units()[-1].workers == ("llm-0-combined",)
    lister = Path(sys.executable).with_name("ansible-inventory")
    if lister.is_file() or shutil.which("ansible-inventory"):
        r = subprocess.run([str(lister) if lister.is_file() else "ansible-inventory", "-i", str(path), "--list"],
                           check=False, capture_output=True, text=True, timeout=60)
        listed = yaml.safe_load(r.stdout)
        assert [w["id"] for w in listed["_meta"]["hostvars"]["d"]["llm_node_workers"]] == ["llm-0-combined"]
    before = copy.deepcopy(again.doc)
    assert again.remove("llm-0-combined").host == "d" and again.remove("nobody") is None
    again.save()
    final = InventoryFile.load(path)
    assert "llm_node_workers" not in final.host_vars("d") and "d" in final.group("combined")
    assert final.doc["all"]["children"] == before["all"]["children"]  # the host stays a candidate


@pytest.mark.redis
def test_the_layout_in_force_is_the_recorded_one_while_it_lists_the_inventorys_workers(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = OServeKeys(f"hx-{uuid.uuid4().hex[:10]}")
    inv = InventoryFile(cluster())
    try:
        assert layout_in_force(client, keys, inv) == (inv.units(), None)  # never switched: the inventory's
        recorded = list(reversed(inv.units()))
        client.set(keys.plan_current, PlanRecord(id="s1", layout=recorded, at=1.0).model_dump_json())
        assert layout_in_force(client, keys, inv)[0] == recorded
        inv.place("encode-0", "encode", None, DEFAULTS)  # edited and re-deployed since: the inventory's again
        assert layout_in_force(client, keys, inv)[0] == inv.units()
    finally:
        client.delete(keys.plan_current)
        client.close()


def test_switch_says_what_it_lacks(tmp_path, capsys):
    doc = cluster()
    doc["all"]["hosts"]["c"] |= {"tierserve_advertise_address": "127.0.0.1"}
    doc["all"]["vars"]["tierserve_redis_port"] = 1
    inventory, plan = tmp_path / "cluster.yml", tmp_path / "plan.yaml"
    inventory.write_text(yaml.safe_dump(doc))
    plan.write_text(small_plan().to_yaml())
    assert main(["deploy", "switch", str(plan), "-i", str(inventory)]) == 2
    assert "no secrets file at" in capsys.readouterr().err
    inventory.with_name("cluster.secrets.yml").write_text(yaml.safe_dump(
        {"tierserve_redis_password": "p" * 32, "tierserve_admin_token": "t" * 32}))
    assert main(["deploy", "switch", str(tmp_path / "nope.yaml"), "-i", str(inventory)]) == 2
    assert "cannot read plan file" in capsys.readouterr().err
    assert main(["deploy", "switch", str(plan), "-i", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the cluster's Redis at 127.0.0.1:1" in err and "p" * 32 not in err


@pytest.mark.slow
@pytest.mark.long  # two ansible-playbook runs against an unreachable host: ~120 s
@pytest.mark.redis
def test_a_failing_worker_playbook_is_a_failed_start_with_its_log(tmp_path, redis_url):
    """A host Ansible cannot reach: the start's ansible-playbook exits non-zero, the worker never counts as
    registered, its failure carries the log's tail, and stopping it removes its entry."""
    if not Path(sys.executable).with_name("ansible-playbook").is_file() and shutil.which("ansible-playbook") is None:
        pytest.skip("ansible-playbook is not installed (make deploy-deps)")
    doc = cluster()
    for hv in doc["all"]["hosts"].values():
        hv |= {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_ssh_common_args": "-o ConnectTimeout=5"}
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump(doc))
    secrets = tmp_path / "secrets.yml"
    secrets.write_text(yaml.safe_dump({n: "x" * 32 for n in ("tierserve_cluster_secret", "tierserve_admin_token",
                                                             "tierserve_redis_password")}))
    client = redis.Redis.from_url(redis_url)
    inv = InventoryFile.load(path)
    ex = HostExecutor(inv, Playbook(path, ROOT / "deploy", secrets), client, DEFAULTS, tmp_path / "logs", 120.0)
    ex.start("encode-0", "encode", None)
    assert InventoryFile.load(path).workers()["encode-0"].host == "a"
    deadline = time.monotonic() + 120
    while ex.busy and time.monotonic() < deadline:
        assert not ex.registered("encode-0")
        time.sleep(0.2)
    assert not ex.busy and not ex.registered("encode-0")
    assert "starting encode-0 on a: ansible-playbook exited 4" in ex.failures["encode-0"]
    assert "UNREACHABLE" in ex.failures["encode-0"], ex.failures
    ex.stop("encode-0")  # the stop cannot reach the host either: surfaced, and the entry stays
    deadline = time.monotonic() + 120
    while ex.busy and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(HostExecutorError, match="stopping encode-0 on a"):
        ex.stopped("encode-0")
    assert "encode-0" in InventoryFile.load(path).workers()
    client.close()
