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

from coordinator.planner.planfile import PlanFile

_LLM_ROLE = {"P": "prefill", "D": "decode", "P+D": "combined"}


@dataclass(frozen=True)
class PlannedCluster:
    """What a plan asks of the local launcher (ClusterSpec fields) and what it leaves out."""

    encode_workers: int
    llm_roles: list[str]
    colocated: list[frozenset[str]]
    llm_args: list[str]
    notes: list[str]
    """What the local cluster does not reproduce, for the user to read."""


def planned_cluster(plan: PlanFile) -> PlannedCluster:
    """The local layout of `plan`: E+P encoders first, then E, then the LLM GPUs in the plan's order."""
    encoders = sorted((n for n in plan.nodes if n.role in ("E", "E+P")), key=lambda n: n.role != "E+P")
    stealing = plan.policy.stealing.enabled
    colocated = [frozenset({"prefill"} if n.role == "E+P" else {"steal"} if stealing else set()) for n in encoders]
    roles = [_LLM_ROLE[n.role] for n in plan.nodes if n.role in _LLM_ROLE]  # a valid plan has a D for its E+P
    hosts = sorted({n.host for n in plan.nodes})
    notes = [f"the plan is for {plan.model} on {', '.join(sorted({n.tier for n in plan.nodes}))} GPUs"
             f"{' across hosts ' + ', '.join(hosts) if len(hosts) > 1 else ''}; here each GPU's role is a process "
             f"on this machine, serving --model"]
    notes.append(f"engines: max_num_seqs {plan.engine.max_num_seqs} as planned; the step token budget stays each "
                 f"worker's own (at least the served model's context), not the plan's {plan.engine.max_num_batched_tokens}")
    return PlannedCluster(len(encoders), roles, colocated, ["--max-num-seqs", str(plan.engine.max_num_seqs)], notes)
