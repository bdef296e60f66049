"""`tierserve up --plan`: a plan file's roles become the local workers and its policy is in force."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from plan_file_factory import small_plan

from coordinator.plan_launch import planned_cluster
from coordinator.planner.planfile import PlanFile, PlanFileError, PlanNode
from coordinator.policies.base import BatchPolicyConfig, OffloadConfig, PolicyConfig
from coordinator.policies.work_stealing import WorkStealingConfig
from coordinator.redis_server import free_port


@pytest.fixture(scope="module")
def plan() -> PlanFile:
    return small_plan(trials=2, requests=20, prediction=30)


def _with(plan: PlanFile, roles: list[str], policy: PolicyConfig) -> PlanFile:
    nodes = [PlanNode(host="h1" if i < 2 else "h2", gpu_index=i, tier="A100-80GB", role=r) for i, r in enumerate(roles)]
    return PlanFile.model_validate(plan.model_dump() | {"nodes": [n.model_dump() for n in nodes],
                                                        "policy": policy.model_dump(), "prices": {"A100-80GB": 1.0}})


def test_roles_map_to_workers_and_stealing_lands_on_e_gpus(plan):
    stealing = PolicyConfig(stealing=WorkStealingConfig(enabled=True))
    layout = planned_cluster(_with(plan, ["E", "P+D", "E+P", "D", "P"], stealing))
    assert layout.encode_workers == 2
    assert layout.colocated == [frozenset({"prefill"}), frozenset({"steal"})]   # E+P first, then E with its stealer
    assert layout.llm_roles == ["combined", "decode", "prefill"]
    assert layout.llm_args[:2] == ["--max-num-seqs", str(plan.engine.max_num_seqs)]
    assert "across hosts h1, h2" in layout.notes[0]
    plain = planned_cluster(_with(plan, ["E", "P+D"], PolicyConfig()))
    assert plain.colocated == [frozenset()] and plain.llm_roles == ["combined"]      # no stealing: no stealer


def test_a_plan_of_only_e_p_and_d_gpus_is_a_cluster_the_launcher_takes(plan):
    """Every prefill on the encode GPUs (s = 1), decode on the D GPU: a valid HAS layout with no P or P+D GPU,
    which the launcher refused ("no LLM worker can prefill") before it counted co-located prefill workers."""
    from coordinator.launcher import ClusterSpec

    layout = planned_cluster(_with(plan, ["E+P", "D"], PolicyConfig(offload=OffloadConfig(s=1.0))))
    assert layout.llm_roles == ["decode"] and layout.colocated == [frozenset({"prefill"})]
    ClusterSpec(encode_workers=layout.encode_workers, llm_roles=layout.llm_roles, colocated=layout.colocated).validate()


def test_the_plans_engine_runs_on_every_llm_worker(plan):
    vllm = _with(plan, ["E", "P", "D"], PolicyConfig())
    vllm = vllm.model_copy(update={"engine": vllm.engine.model_copy(update={"kind": "vllm"})})
    assert planned_cluster(vllm).llm_args[2:4] == ["--engine", "vllm"]
    shared = _with(plan, ["E+P", "D"], PolicyConfig())
    shared = shared.model_copy(update={"engine": shared.engine.model_copy(update={"kind": "vllm"})})
    with pytest.raises(PlanFileError, match="sharing an encode GPU"):
        planned_cluster(shared)


def test_a_simulated_only_plan_is_refused_with_its_reasons(plan):
    simulated = _with(plan, ["E", "P+D"], PolicyConfig()).model_copy(
        update={"simulated_only": ["int8 weight-only: the reference engine loads bf16/fp32 weights only"]})
    with pytest.raises(PlanFileError, match="simulated only.*int8 weight-only"):
        planned_cluster(simulated)


@pytest.mark.redis
@pytest.mark.slow
def test_up_runs_the_plan_and_puts_its_policy_in_force(plan, redis_url, tmp_path):
    policy = PolicyConfig(batch=BatchPolicyConfig(name="adaptive", max_batch=3, max_wait_s=0.2),
                          offload=OffloadConfig(s=0.4))
    path = _with(plan, ["E+P", "P+D", "D"], policy).save(tmp_path / "plan.yaml")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "up", "--plan", str(path), "--port", str(port),
                             "--redis-url", redis_url, "--key-prefix", f"tsplan-{uuid.uuid4().hex[:10]}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, out = time.monotonic() + 150, None
        while time.monotonic() < deadline and out is None:
            assert proc.poll() is None, proc.stdout.read()
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/v1/admin/policy", timeout=1).json()
                workers = httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=1).json()["workers"]
                if got == policy.model_dump(mode="json") and len(workers) == 4:  # E, its local P, P+D, D
                    out = workers
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.3)
        assert out is not None, "the plan's policy never came into force on a 4-worker cluster"
        assert sorted(w["role"] for w in out) == ["combined", "decode", "encode", "prefill"]
        assert [w["colocated_with"] for w in out if w["role"] == "prefill"] == ["encode-0"]
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "policy in force" in text and "plan:" in text, text
    finally:  # SIGTERM first: `up` then stops its workers (SIGKILL would orphan them)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_bad_plan_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text("version: 7\n")
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "up", "--plan", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "error:" in r.stdout and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
