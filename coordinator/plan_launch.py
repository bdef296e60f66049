"""`tierserve up --plan PLAN.yaml`: run a plan file's roles and knobs as a local cluster.

A plan (coordinator/planner/planfile.py) names GPUs on hosts with a role each. The local launcher
has one worker process per role instead of one GPU: E -> an encode worker; E+P -> an encode worker
with a co-located prefill worker (the offload share s); P -> prefill; D -> decode; P+D -> combined.
With stealing on, every E GPU also gets a co-located stealing worker (as the simulator steals on E
GPUs only). The engines' sequence limit becomes an llm_node flag, and the plan's whole PolicyConfig is put in
force through PUT /v1/admin/policy once the cluster is up, so B, p, A, s, the SM split and stealing are
exactly the plan's. Hosts, GPU tiers and the planned model are not emulated: every process runs here,
on the model given with --model; deploy/ is what places the roles on the plan's hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.planner.planfile import PlanFile, PlanFileError
from coordinator.protocol.roles import LLM_ROLE_OF_NODE



@dataclass(frozen=True)
class PlannedCluster:
    """What a plan asks of the local launcher (ClusterSpec fields) and what it leaves out."""

    encode_workers: int
    llm_roles: list[str]
    colocated: list[frozenset[str]]
    llm_args: list[str]
    gpu_indices: list[int]
    """Per device slot (encoders, then LLM GPUs, as above), the planned GPU's CUDA index (for --device cuda)."""
    notes: list[str]
    """What the local cluster does not reproduce, for the user to read."""


def planned_cluster(plan: PlanFile) -> PlannedCluster:
    """The local layout of `plan`: E+P encoders first, then E, then the LLM GPUs in the plan's order.
    PlanFileError for a plan marked simulated only (variants no engine here runs: one process per GPU)."""
    check_engine(plan)
    if plan.simulated_only:
        raise PlanFileError("this plan is simulated only and cannot be launched: " + "; ".join(plan.simulated_only)
                            + " (re-plan with `tierserve plan --dtypes bf16 --tp 1` for a plan that runs here)")
    encoders = sorted((n for n in plan.nodes if n.role in ("E", "E+P")), key=lambda n: n.role != "E+P")
    stealing = plan.policy.stealing.enabled
    colocated = [frozenset({"prefill"} if n.role == "E+P" else {"steal"} if stealing else set()) for n in encoders]
    llm_nodes = [n for n in plan.nodes if n.role in LLM_ROLE_OF_NODE]
    roles = [LLM_ROLE_OF_NODE[n.role] for n in llm_nodes]  # a valid plan has a D for its E+P
    gpus = [n.gpu_index for n in [*encoders, *llm_nodes]]
    hosts = sorted({n.host for n in plan.nodes})
    notes = [f"the plan is for {plan.model} on {', '.join(sorted({n.tier for n in plan.nodes}))} GPUs"
             f"{' across hosts ' + ', '.join(hosts) if len(hosts) > 1 else ''}; here each GPU's role is a process "
             f"on this machine, serving --model"]
    notes.append(f"engines: max_num_seqs {plan.engine.max_num_seqs} as planned; the step token budget stays each "
                 f"worker's own (at least the served model's context), not the plan's {plan.engine.max_num_batched_tokens}")
    if len(set(gpus)) < len(gpus):
        notes.append(f"with --device cuda, planned GPUs of different hosts share a CUDA index here: {gpus}")
    return PlannedCluster(len(encoders), roles, colocated, ["--max-num-seqs", str(plan.engine.max_num_seqs), "--engine", plan.engine.kind], gpus,
                          notes)


def check_engine(plan: PlanFile) -> None:
    """PlanFileError when the plan's engine cannot run its layout: LLM workers sharing an encode GPU (E+P, work
    stealing) step their engine in the worker process, which only the reference engine does."""
    if plan.engine.kind != "reference" and (any(n.role == "E+P" for n in plan.nodes) or plan.policy.stealing.enabled):
        raise PlanFileError(f"engine {plan.engine.kind!r}: LLM workers sharing an encode GPU (E+P, work stealing) "
                            "step their engine in the worker process, which only the reference engine does; "
                            "use engine.kind reference or a plan without E+P and stealing")
