"""`tierserve deploy inventory`: a plan file placed on real hosts, as an Ansible YAML inventory.

Every planned GPU (a tier and a role) is matched to a real GPU of the same tier: a plan whose host
labels are real host names keeps its placement; otherwise the GPUs of one planned host stay together
where a real host has room. Each GPU becomes worker processes exactly as `tierserve up --plan` makes
them (coordinator/plan_launch.py): E -> an encode worker (+ a stealing combined worker when the plan
steals); E+P -> an encode worker and its co-located prefill worker; P, D, P+D -> prefill, decode,
combined. The inventory has a group per role (redis, coordinator, encode, llm with prefill, decode,
combined), host variables with the workers, their GPU (CUDA_VISIBLE_DEVICES) and the advertised
address, and the plan's policy, which deploy/site.yml puts in force through the admin API.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from coordinator.deploy.hosts import DeployError, HostsFile
from coordinator.deploy.inventory_file import GPU_COUNT_VAR
from coordinator.planner.catalog import Catalog, load_catalog
from coordinator.plan_launch import check_engine
from coordinator.planner.planfile import PlanFile, PlanFileError, PlanNode
from coordinator.protocol.roles import LLM_ROLE_OF_NODE, LLM_ROLES

TRANSPORTS = ("tcp", "ucx", "nixl", "local")


@dataclass(frozen=True)
class InventoryOptions:
    """What the plan does not say and the operator may: how tensors move, where the model is, ports."""

    transport: str = "tcp"
    """tcp, ucx or nixl across hosts; local only when everything runs on one host."""
    model_dir: str | None = None
    """The checkpoint directory on every host (None: the tiny model shipped in the package)."""
    model_name: str | None = None
    """The name clients use in `model` (None: the directory's name, or tiny-llava)."""
    key_prefix: str = "tierserve"
    coordinator_port: int = 8000
    redis_port: int = 6379
    dtype: str | None = None
    """--dtype of every worker (None: the worker's default)."""


def _placement(plan: PlanFile, hosts: HostsFile, catalog: Catalog) -> dict[PlanNode, tuple[str, int]]:
    """Each planned GPU's (real host, CUDA index); DeployError naming the shortfall per tier."""
    free: dict[str, list[tuple[str, int]]] = {}
    for host in hosts.hosts:
        for index, tier in enumerate(host.gpu_tiers()):
            try:
                free.setdefault(catalog.resolve(tier), []).append((host.name, index))
            except KeyError as exc:
                raise DeployError(f"host {host.name}: {exc.args[0]}") from None
    needed = Counter(catalog.resolve(n.tier) for n in plan.nodes)
    short = [f"{count} x {tier} (the hosts have {len(free.get(tier, []))}"
             f"{': ' + ', '.join(f'{h} {c}' for h, c in Counter(h for h, _ in free.get(tier, [])).items()) if free.get(tier) else ''})"
             for tier, count in needed.items() if count > len(free.get(tier, []))]
    if short:
        raise DeployError(f"the plan needs more GPUs than the hosts have: it needs {'; '.join(short)}. Add hosts "
                          f"with these GPUs to the hosts file, or re-plan on what you have (`tierserve plan --gpus "
                          f"{','.join(f'{len(v)}x{k}' for k, v in free.items())}`)")
    placed: dict[PlanNode, tuple[str, int]] = {}
    as_planned = all(any(h.name == n.host for h in hosts.hosts) for n in plan.nodes)
    prefer: dict[str, str] = {}
    for node in sorted(plan.nodes, key=lambda n: (n.host, n.gpu_index)):
        tier = catalog.resolve(node.tier)
        slots = free[tier]
        want = (node.host, node.gpu_index) if as_planned else None
        if want is None or want not in slots:
            host = prefer.get(node.host)
            want = next((s for s in slots if s[0] == host), slots[0])
        slots.remove(want)
        prefer.setdefault(node.host, want[0])
        placed[node] = want
    return placed


def _workers(node: PlanNode, host: str, gpu: int, tier: str, plan: PlanFile, device: str,
             dtype: str | None) -> tuple[list[dict], list[dict]]:
    """(encode workers, LLM workers) one planned GPU runs."""
    base = {"gpu": gpu, "tier": tier, "device": device} | ({"dtype": dtype} if dtype else {})
    stem = f"{host}-gpu{gpu}"
    encode, llm = [], []
    seqs = plan.engine.max_num_seqs
    engine = {"engine": plan.engine.kind} if plan.engine.kind != "reference" else {}
    if node.role in ("E", "E+P"):
        encode.append({"id": f"{stem}-encode", **base, "max_batch_size": plan.policy.batch.max_batch})
        if node.role == "E+P":
            llm.append({"id": f"{stem}-prefill", "role": "prefill", **base, "colocate_with": f"{stem}-encode",
                        "max_num_seqs": seqs})
        elif plan.policy.stealing.enabled:
            llm.append({"id": f"{stem}-steal", "role": "combined", **base, "colocate_with": f"{stem}-encode",
                        "max_num_seqs": seqs})
    else:
        role = LLM_ROLE_OF_NODE[node.role]
        llm.append({"id": f"{stem}-{role}", "role": role, **base, "max_num_seqs": seqs, **engine})
    return encode, llm


def build_inventory(plan: PlanFile, hosts: HostsFile, options: InventoryOptions = InventoryOptions(),
                    catalog: Catalog | None = None) -> dict:
    """The Ansible inventory (a dict to dump as YAML) that deploys `plan` on `hosts`."""
    catalog = catalog or load_catalog()
    if options.transport not in TRANSPORTS:
        raise DeployError(f"transport {options.transport!r} is not one of {', '.join(TRANSPORTS)}")
    try:
        check_engine(plan)
    except PlanFileError as e:
        raise DeployError(str(e)) from None
    placed = _placement(plan, hosts, catalog)
    encode: dict[str, list[dict]] = {}
    llm: dict[str, list[dict]] = {}
    for node, (host, gpu) in placed.items():
        h = hosts.host(host)
        e, l = _workers(node, host, gpu, catalog.resolve(node.tier), plan, h.device or "cuda:0", options.dtype)
        encode.setdefault(host, []).extend(e)
        llm.setdefault(host, []).extend(l)
    used = {hosts.coordinator_host, hosts.redis_host, *(h for h, _ in placed.values())}
    if options.transport == "local" and len(used) > 1:
        raise DeployError(f"transport local moves tensors within one host only, and this cluster spans "
                          f"{len(used)} ({', '.join(sorted(used))}); use --transport tcp, ucx or nixl")
    host_vars: dict[str, dict] = {}
    for h in hosts.hosts:
        if h.name not in used:
            continue
        v: dict = {"ansible_host": h.address, "tierserve_advertise_address": h.reach}
        if h.ssh_user:
            v["ansible_user"] = h.ssh_user
        if h.python:
            v["ansible_python_interpreter"] = h.python
        if h.gpu_tiers():  # a live switch (`tierserve deploy switch`) places no worker on a host whose GPUs are all held
            v[GPU_COUNT_VAR] = len(h.gpu_tiers())
        if encode.get(h.name):
            v["encode_node_workers"] = sorted(encode[h.name], key=lambda w: w["id"])
        if llm.get(h.name):
            v["llm_node_workers"] = sorted(llm[h.name], key=lambda w: w["id"])
        host_vars[h.name] = v

    def group(names) -> dict:
        return {"hosts": {n: {} for n in sorted(set(names))}}

    llm_groups = {role: group(h for h, ws in llm.items() for w in ws if w["role"] == role) for role in LLM_ROLES}
    variables = {
        "tierserve_transport": options.transport, "tierserve_key_prefix": options.key_prefix,
        "tierserve_coordinator_port": options.coordinator_port, "tierserve_redis_port": options.redis_port,
        "tierserve_policy": plan.policy.model_dump(mode="json"),
        "tierserve_plan": {"model": plan.model, "created_at": plan.created_at,
                           "predicted_goodput_rps": round(plan.predicted.goodput_rps, 3),
                           "cost_per_hour": round(plan.cost_per_hour(), 2)},
    }
    if options.model_dir:
        variables["tierserve_model_dir"] = options.model_dir
    if options.model_name:
        variables["tierserve_model_name"] = options.model_name
    return {"all": {"vars": variables, "hosts": host_vars, "children": {
        "redis": group([hosts.redis_host]), "coordinator": group([hosts.coordinator_host]),
        "encode": group(h for h, ws in encode.items() if ws),
        "llm": {"children": {r: g for r, g in llm_groups.items() if g["hosts"]}},
    }}}
