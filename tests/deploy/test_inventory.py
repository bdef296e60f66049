"""`tierserve deploy inventory` on plan files `tierserve plan` writes: every planned GPU lands on a real GPU
of its tier, the workers are those `tierserve up --plan` would start, Ansible itself parses the result, and
a plan needing more GPUs of a tier than the hosts have is refused with the shortfall named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plan_file_factory import small_plan

from coordinator.cli import main
from coordinator.deploy.hosts import DeployError, HostsFile, load_hosts
from coordinator.deploy.inventory import InventoryOptions, build_inventory
from coordinator.planner.planfile import PlanFile

SEEDS_HOSTS = {"hosts": [
    {"name": "enc-1", "address": "10.0.0.11", "gpus": ["RTX4090"]},
    {"name": "enc-2", "address": "10.0.0.12", "gpus": ["4090"]},
    {"name": "llm-1", "address": "10.0.0.21", "advertise_address": "192.168.0.21", "gpus": [{"tier": "A100", "count": 1}]},
    {"name": "llm-2", "address": "10.0.0.22", "gpus": ["A100-80GB"], "ssh_user": "ops"},
], "coordinator": "llm-1"}


@pytest.fixture(scope="module")
def plan() -> PlanFile:
    return small_plan()


@pytest.fixture(scope="module")
def seeds_plan(plan) -> PlanFile:
    """The seeds' layout as a plan: two RTX 4090 encoders (one with a local prefill), two A100s (P, D)."""
    nodes = [{"host": "node0", "gpu_index": 0, "tier": "RTX4090", "role": "E+P"},
             {"host": "node1", "gpu_index": 0, "tier": "RTX4090", "role": "E"},
             {"host": "node2", "gpu_index": 0, "tier": "A100-80GB", "role": "P"},
             {"host": "node2", "gpu_index": 1, "tier": "A100-80GB", "role": "D"}]
    return PlanFile.model_validate(plan.model_dump(mode="json") | {
        "nodes": nodes, "prices": {"RTX4090": 0.5, "A100-80GB": 3.67}})


def _workers(inv: dict) -> dict[str, list[dict]]:
    return {h: v.get("encode_node_workers", []) + v.get("llm_node_workers", []) for h, v in inv["all"]["hosts"].items()}


def test_the_written_plan_is_placed_on_gpus_of_its_tiers(plan):
    inv = build_inventory(plan, HostsFile.model_validate(SEEDS_HOSTS))
    placed = [(w["tier"], w["role"] if "role" in w else "encode") for ws in _workers(inv).values() for w in ws]
    roles = {n.role for n in plan.nodes}
    expected = sum(2 if r == "E+P" else 1 for r in [n.role for n in plan.nodes]) + sum(
        1 for n in plan.nodes if n.role == "E" and plan.policy.stealing.enabled)
    assert len(placed) == expected
    assert all(tier == "RTX4090" for tier, _ in placed) == all(n.tier == "RTX4090" for n in plan.nodes)
    assert inv["all"]["vars"]["tierserve_policy"] == plan.policy.model_dump(mode="json")
    if "E+P" in roles:  # the local prefill worker shares its encoder's GPU, on its host
        for ws in _workers(inv).values():
            for w in ws:
                if "colocate_with" in w:
                    enc = next(e for e in ws if e["id"] == w["colocate_with"])
                    assert enc["gpu"] == w["gpu"]


def test_seeds_cluster_inventory(seeds_plan):
    inv = build_inventory(seeds_plan, HostsFile.model_validate(SEEDS_HOSTS), InventoryOptions(transport="nixl"))
    hosts = inv["all"]["hosts"]
    assert {h: [(w["id"], w.get("role", "encode"), w["gpu"]) for w in ws] for h, ws in _workers(inv).items()} == {
        "enc-1": [("enc-1-gpu0-encode", "encode", 0), ("enc-1-gpu0-prefill", "prefill", 0)],
        "enc-2": [("enc-2-gpu0-encode", "encode", 0)],
        "llm-1": [("llm-1-gpu0-prefill", "prefill", 0)],
        "llm-2": [("llm-2-gpu0-decode", "decode", 0)]}
    assert hosts["llm-1"]["tierserve_advertise_address"] == "192.168.0.21"
    assert hosts["llm-1"]["ansible_host"] == "10.0.0.21" and hosts["llm-2"]["ansible_user"] == "ops"
    assert {h: v["tierserve_gpus"] for h, v in hosts.items()} == {"enc-1": 1, "enc-2": 1, "llm-1": 1, "llm-2": 1}
    assert all(w["device"] == "cuda:0" for ws in _workers(inv).values() for w in ws)
    children = inv["all"]["children"]
    assert list(children["redis"]["hosts"]) == ["llm-1"] and list(children["coordinator"]["hosts"]) == ["llm-1"]
    assert sorted(children["encode"]["hosts"]) == ["enc-1", "enc-2"]
    assert sorted(children["llm"]["children"]) == ["decode", "prefill"]
    assert sorted(children["llm"]["children"]["prefill"]["hosts"]) == ["enc-1", "llm-1"]
    assert inv["all"]["vars"]["tierserve_transport"] == "nixl"


def test_the_plans_engine_reaches_its_llm_workers(seeds_plan):
    engine = seeds_plan.engine.model_copy(update={"kind": "vllm"})
    nodes = [n.model_copy(update={"role": "E"}) if n.role == "E+P" else n for n in seeds_plan.nodes]
    inv = build_inventory(seeds_plan.model_copy(update={"engine": engine, "nodes": nodes}),
                          HostsFile.model_validate(SEEDS_HOSTS))
    engines = {w["id"]: w.get("engine") for ws in _workers(inv).values() for w in ws if "role" in w}
    assert engines == {"llm-1-gpu0-prefill": "vllm", "llm-2-gpu0-decode": "vllm"}
    with pytest.raises(DeployError, match="sharing an encode GPU"):  # E+P: a prefill worker on an encode GPU
        build_inventory(seeds_plan.model_copy(update={"engine": engine}), HostsFile.model_validate(SEEDS_HOSTS))


def test_planned_host_names_that_exist_keep_their_placement(seeds_plan):
    hosts = HostsFile.model_validate({"hosts": [
        {"name": "node2", "address": "10.0.0.2", "gpus": [{"tier": "A100", "count": 2}]},
        {"name": "node1", "address": "10.0.0.3", "gpus": ["RTX4090"]},
        {"name": "node0", "address": "10.0.0.4", "gpus": ["RTX4090"]}]})
    inv = build_inventory(seeds_plan, hosts)
    assert [w["id"] for w in _workers(inv)["node2"]] == ["node2-gpu0-prefill", "node2-gpu1-decode"]
    assert [w["id"] for w in _workers(inv)["node0"]] == ["node0-gpu0-encode", "node0-gpu0-prefill"]


def test_a_gpu_shortfall_names_the_tier_and_the_counts(seeds_plan):
    short = HostsFile.model_validate({"hosts": [
        {"name": "enc-1", "address": "10.0.0.11", "gpus": ["RTX4090", "RTX4090"]},
        {"name": "llm-1", "address": "10.0.0.21", "gpus": ["A100"]}]})
    with pytest.raises(DeployError) as e:
        build_inventory(seeds_plan, short)
    assert "needs 2 x A100-80GB (the hosts have 1: llm-1 1)" in str(e.value)
    assert "RTX4090" not in str(e.value).split("It needs")[0].split("needs")[1].split(".")[0]


def test_local_transport_is_refused_across_hosts(seeds_plan):
    with pytest.raises(DeployError, match="transport local moves tensors within one host only"):
        build_inventory(seeds_plan, HostsFile.model_validate(SEEDS_HOSTS), InventoryOptions(transport="local"))


def test_bad_hosts_files_name_the_problem(tmp_path):
    bad = tmp_path / "hosts.yaml"
    bad.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "x", "gpus": ["A100"]},
                                             {"name": "a", "address": "y"}], "coordinator": "b"}))
    with pytest.raises(DeployError, match=r"listed twice|not one of the hosts"):
        load_hosts(bad)
    with pytest.raises(DeployError, match="cannot read hosts file"):
        load_hosts(tmp_path / "missing.yaml")
    unknown = HostsFile.model_validate({"hosts": [{"name": "a", "address": "x", "gpus": ["TPUv9"]}]})
    with pytest.raises(DeployError, match="host a: unknown GPU tier 'TPUv9'"):
        build_inventory(small_plan(), unknown)


def test_cli_writes_an_inventory_ansible_parses(seeds_plan, tmp_path, capsys):
    plan_path = seeds_plan.save(tmp_path / "plan.yaml")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump(SEEDS_HOSTS))
    out = tmp_path / "cluster.yml"
    assert main(["deploy", "inventory", str(plan_path), "--hosts", str(hosts), "--out", str(out)]) == 0
    assert "5 workers on 4 hosts" in capsys.readouterr().out
    inventory_cli = Path(sys.executable).with_name("ansible-inventory")
    if not inventory_cli.is_file() and shutil.which("ansible-inventory") is None:
        pytest.skip("ansible-inventory is not installed (make deploy-deps)")
    r = subprocess.run([str(inventory_cli) if inventory_cli.is_file() else "ansible-inventory", "-i", str(out),
                        "--list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    parsed = json.loads(r.stdout)
    assert sorted(parsed["prefill"]["hosts"]) == ["enc-1", "llm-1"]
    assert parsed["_meta"]["hostvars"]["enc-1"]["encode_node_workers"][0]["tier"] == "RTX4090"


def test_cli_shortfall_is_a_message_and_exit_2(seeds_plan, tmp_path, capsys):
    plan_path = seeds_plan.save(tmp_path / "plan.yaml")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": [{"name": "one", "address": "10.0.0.1", "gpus": ["RTX4090"]}]}))
    assert main(["deploy", "inventory", str(plan_path), "--hosts", str(hosts)]) == 2
    err = capsys.readouterr().err
    assert "needs 1 x RTX4090 (the hosts have 0" not in err
    assert "2 x A100-80GB (the hosts have 0)" in err and "2 x RTX4090 (the hosts have 1: one 1)" in err
    assert main(["deploy", "inventory", str(tmp_path / "nope.yaml"), "--hosts", str(hosts)]) == 2
    assert "cannot read plan file" in capsys.readouterr().err
    assert main(["deploy", "status", "-i", str(tmp_path / "nope.yml")]) == 2
    assert "no inventory at" in capsys.readouterr().err
