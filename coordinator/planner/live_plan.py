"""`tierserve plan --live URL`: the search's trials on a running cluster instead of the simulator.

The admin endpoint moves knobs, not GPUs, so a live search tunes the allocation the cluster runs, read
from its workers (GET /v1/cluster): an encode worker with a co-located prefill worker is an E+P GPU,
one without an E GPU (its co-located stealing worker, if any, shares that GPU); a prefill, decode or
combined worker of its own is a P, D or P+D GPU, on the tier each worker reports. Each trial puts its
knobs in force and replays the workload (LiveBackend); the cluster's policy is put back afterwards.
"""

from __future__ import annotations

from collections import Counter

import httpx

from coordinator.planner.allocation import Allocation, parse_allocation
from coordinator.planner.catalog import Catalog
from coordinator.planner.live import LiveBackend, LiveTrialError, apply_policy
from coordinator.planner.live_http import LiveClusterError
from coordinator.planner.planning import Method, PlanContext, search
from coordinator.planner.search import OnTrial, SearchResult
from coordinator.policies.base import PolicyConfig
from coordinator.protocol.roles import NODE_OF_LLM_ROLE



def deployed_allocation(workers: list[dict], catalog: Catalog) -> Allocation:
    """The GPU layout a cluster's workers (GET /v1/cluster's `workers`) make up."""
    local = {w.get("colocated_with") for w in workers if w.get("role") == "prefill" and w.get("colocated_with")}
    roles: Counter[tuple[str, str]] = Counter()
    for w in workers:
        tier, role = w.get("tier") or "cpu", w.get("role")
        if role == "encode":
            roles[(tier, "E+P" if w.get("worker_id") in local else "E")] += 1
        elif role in NODE_OF_LLM_ROLE and not w.get("colocated_with"):
            roles[(tier, NODE_OF_LLM_ROLE[role])] += 1
    if not roles:
        raise LiveClusterError("the cluster lists no workers (GET /v1/cluster); start them first (`tierserve up`)")
    return parse_allocation(",".join(f"{n}x{tier}:{role}" for (tier, role), n in roles.items()), catalog)


def read_deployed(url: str, catalog: Catalog, admin_token: str | None = None) -> Allocation:
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/cluster", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise LiveClusterError(f"cannot reach {url}/v1/cluster: {exc!r}; is the cluster up (`tierserve up`)?") from None
    if r.status_code != 200:
        raise LiveClusterError(f"GET {url}/v1/cluster answered {r.status_code}; is {url} a tierserve coordinator?")
    return deployed_allocation(r.json().get("workers") or [], catalog)


def live_search(ctx: PlanContext, url: str, deployed: Allocation, method: Method, trials: int, seed: int,
                admin_token: str | None = None, storage: str | None = None, study_name: str | None = None,
                on_trial: OnTrial | None = None) -> SearchResult:
    """Search `deployed`'s knobs with every trial on the cluster at `url`; its policy is restored after."""
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        try:
            saved = PolicyConfig.model_validate(client.get("/v1/admin/policy").json())
        except (httpx.HTTPError, ValueError) as exc:
            raise LiveTrialError(f"cannot read {url}/v1/admin/policy: {exc}") from None
        backend = LiveBackend(client, deployed, deployed.cost_per_hour(ctx.catalog), ctx.workload, ctx.request.slo,
                              requests=ctx.request.requests_per_trial, seed=ctx.request.workload_seed,
                              admin_token=admin_token)
        try:
            return search(ctx, method, trials, seed, storage, study_name, on_trial, backend=backend, only=deployed)
        finally:
            apply_policy(client, saved, admin_token)
