"""The plan file (DESIGN "Contracts"): what `tierserve plan` decided, for `tierserve up`, the admin endpoint
and deploy/ to consume.

A versioned YAML document: the cluster's nodes (host, GPU index, tier, role), the policy knobs as the
coordinator stores them (a PolicyConfig), the engines' batching limits, the SLO and the workload it
was planned for, the prices it was costed with, its predicted goodput and cost, and how the search
went. `load_plan` turns every problem into a PlanFileError naming the file, the field and the fix.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coordinator.planner.allocation import Allocation, Role
from coordinator.planner.catalog import Catalog
from coordinator.planner.deployment import Deployment, EngineLimits, GPUNode
from coordinator.planner.goodput import SLO
from coordinator.planner.service import Modality
from coordinator.planner.trials import TrialOutcome
from coordinator.planner.variants import Dtype, Variant, service_key, split_key
from coordinator.planner.workload import Workload
from coordinator.policies.base import PolicyConfig

PLAN_VERSION = 1


class PlanFileError(ValueError):
    """A plan file is missing, unreadable or invalid; the message names the file and what to fix."""


class PlanNode(BaseModel):
    """One GPU of the planned cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(min_length=1)
    """Host name or address the GPU sits in (deploy/ reaches it by this name)."""
    gpu_index: int = Field(ge=0)
    """CUDA device index on that host."""
    tier: str = Field(min_length=1)
    """Catalog tier (canonical name)."""
    role: Role
    """E, E+P, P, D or P+D: which workers run on the GPU (coordinator/planner/allocation.py)."""
    tpcs: int | None = Field(None, ge=1)
    """TPCs of the GPU (the catalog's), which an E+P GPU splits between encoder and local prefill; None: the
    simulator's default."""
    dtype: Dtype = "bf16"
    """Weight dtype of the LLM worker on this GPU (variants.py); bf16 for E GPUs."""
    tp: int = Field(1, ge=1)
    """GPUs the LLM worker spans (tensor parallel); the worker's GPUs are worker_gpu .. worker_gpu + tp - 1."""
    worker_gpu: int | None = Field(None, ge=0)
    """With tp > 1: gpu_index of the worker's first GPU (the same on every GPU of one worker); None at tp 1."""

    @property
    def name(self) -> str:
        return f"{self.host}/gpu{self.gpu_index}"

    @property
    def variant(self) -> Variant:
        return Variant(dtype=self.dtype, tp=self.tp)


class Stage1Info(BaseModel):
    """How HAS stage 1 narrowed the allocations (the seeds' "kept 3 of 7 feasible")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    considered: int = Field(ge=0)
    """Allocations scored."""
    feasible: int = Field(ge=0)
    """Those under the utilisation ceiling at every stage."""
    kept: list[str]
    """Labels of the survivors searched in stage 2, best first."""


class SearchInfo(BaseModel):
    """How the plan was found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["has", "random", "coordinate"]
    """The searcher."""
    backend: str
    """Where trials ran ("sim" or "live")."""
    trials: int = Field(ge=1)
    """Trials run."""
    budget: int = Field(ge=1)
    """Trials allowed."""
    stop_reason: str | None = None
    """The stopping rule that ended the search early, if one did."""
    seed: int
    """Sampler seed."""
    storage: str | None = None
    """RDB URL of the resumable study, if any."""
    requests_per_trial: int = Field(ge=1)
    """Requests each trial replayed."""
    best_trial: int = Field(ge=0)
    """Which trial the plan is."""
    best_trial_objective: float = Field(ge=0)
    """That trial's good requests per dollar (the prediction below re-runs it on a longer stream)."""
    stage1: Stage1Info | None = None
    """Stage 1's filter counts (HAS only)."""
    service_times: dict[str, str] = Field(default_factory=dict)
    """Per tier of the plan: where its service times came from ("measured: <profile source>" or "roofline")."""


class PlanFile(BaseModel):
    """A deployable plan; see the module docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    version: Literal[1] = PLAN_VERSION
    """Format version; readers refuse versions they do not know."""
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    """When the plan was made (UTC, ISO 8601)."""
    model: str
    """Model preset or checkpoint the plan is for (ModelArch.name)."""
    modality: Modality
    """The modality the workload carries."""
    nodes: list[PlanNode] = Field(min_length=1)
    """Every GPU used, with its role; GPUs of the inventory left out are unused."""
    policy: PolicyConfig
    """The run-time knobs, as PUT /v1/admin/policy takes them."""
    engine: EngineLimits
    """Batching limits of every LLM engine."""
    slo: SLO
    """The SLO goodput was judged against."""
    workload: Workload
    """The arrival process and request mix planned for."""
    prices: dict[str, float]
    """$/h per tier used for the cost (prices move: this is what the plan assumed)."""
    predicted: TrialOutcome
    """Predicted goodput, latency and cost of the plan on a longer request stream than the trials'."""
    search: SearchInfo
    """How the plan was found."""
    simulated_only: list[str] = Field(default_factory=list)
    """Why the engine here cannot run this plan live (deployment variants it lacks: fp8/int8 weights, tensor
    parallel); empty when it can. A plan with reasons here is simulated only."""
    reasons: list[str] = Field(default_factory=list)
    """Where the planner departed from what was asked, and why (planned at 100% of capacity because no layout
    keeps the requested headroom); empty when it did not."""

    @model_validator(mode="after")
    def _consistent(self) -> PlanFile:
        seen: set[tuple[str, int]] = set()
        for node in self.nodes:
            if (node.host, node.gpu_index) in seen:
                raise ValueError(f"GPU {node.gpu_index} of host {node.host!r} is listed twice; one role per GPU")
            seen.add((node.host, node.gpu_index))
        missing = sorted({n.tier for n in self.nodes} - set(self.prices))
        if missing:
            raise ValueError(f"prices give no $/h for tiers {missing}; add them under prices")
        workers = self._workers()
        for gpus in workers:
            first = gpus[0]
            if len(gpus) != first.tp or any((n.tier, n.role, n.variant) != (first.tier, first.role, first.variant)
                                            for n in gpus):
                raise ValueError(f"worker on {first.name}: its {len(gpus)} GPUs must be {first.tp} (its tp) of one "
                                 f"tier, role and dtype")
        self.allocation()  # raises if some stage has no GPU
        return self

    def _workers(self) -> list[list[PlanNode]]:
        """The GPUs of each LLM or encode worker, in node order (a tp > 1 worker groups by worker_gpu)."""
        groups: dict[tuple[str, int], list[PlanNode]] = {}
        for n in self.nodes:
            groups.setdefault((n.host, n.gpu_index if n.worker_gpu is None else n.worker_gpu), []).append(n)
        return list(groups.values())

    def allocation(self) -> Allocation:
        """The nodes as an Allocation (roles counted per tier and variant)."""
        counts = Counter((service_key(n.tier, n.variant), n.role) for n in self.nodes)
        return Allocation.of(*((n, key, role) for (key, role), n in counts.items()))

    def cost_per_hour(self) -> float:
        return sum(self.prices[n.tier] for n in self.nodes)

    def deployment(self) -> Deployment:
        """The plan as the simulator (and the launcher) take a deployment."""
        return Deployment(nodes=[GPUNode(tier=service_key(w[0].tier, w[0].variant), role=w[0].role, host=w[0].host,
                                         name=w[0].name, tpcs=w[0].tpcs) for w in self._workers()],
                          batch=self.policy.batch, offload=self.policy.offload, partition=self.policy.partition,
                          stealing=self.policy.stealing, engine=self.engine)

    def check_tiers(self, catalog: Catalog) -> None:
        """Raise PlanFileError if a node's tier is not in `catalog` (a plan from another catalog file)."""
        unknown = sorted({n.tier for n in self.nodes} - set(catalog.tiers))
        if unknown:
            raise PlanFileError(f"plan nodes use tiers {unknown} that the catalog ({', '.join(catalog.files)}) does "
                                f"not know; load the catalog file the plan was made with")

    def to_yaml(self) -> str:
        header = (f"# tierserve plan (version {self.version}): {len(self.nodes)} GPUs for {self.model} at "
                  f"{self.workload.arrivals.rate:g} req/s; read with coordinator.planner.planfile.load_plan\n")
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=110)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path


def plan_nodes(deployment: Deployment, host: str) -> list[PlanNode]:
    """One PlanNode per GPU of `deployment` (whose nodes are workers, timed under service keys), numbered from 0."""
    nodes: list[PlanNode] = []
    for worker in deployment.nodes:
        tier, variant = split_key(worker.tier)
        first = len(nodes)
        for i in range(variant.tp):
            nodes.append(PlanNode(host=host, gpu_index=first + i, tier=tier, role=worker.role, tpcs=worker.tpcs,
                                  dtype=variant.dtype, tp=variant.tp, worker_gpu=first if variant.tp > 1 else None))
    return nodes


def load_plan(path: str | Path) -> PlanFile:
    """Read and validate a plan file; every failure is a PlanFileError that says what to do."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanFileError(f"cannot read plan file {path}: {exc.strerror}; write one with `tierserve plan "
                            f"... --out {path}`") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanFileError(f"plan file {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PlanFileError(f"plan file {path} must be a YAML mapping, got {type(doc).__name__}")
    version = doc.get("version")
    if version != PLAN_VERSION:
        raise PlanFileError(f"plan file {path} has version {version!r}; this tierserve reads version {PLAN_VERSION}. "
                            f"Re-run `tierserve plan` to write a current one")
    try:
        return PlanFile.model_validate(doc)
    except ValidationError as exc:
        lines = []
        for err in exc.errors()[:8]:
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            got = "" if err["type"] == "missing" else f" (got {err['input']!r:.80})"
            lines.append(f"  {loc}: {err['msg'].removeprefix('Value error, ')}{got}")
        raise PlanFileError(f"plan file {path} is invalid:\n" + "\n".join(lines)
                            + "\nFix these fields or re-run `tierserve plan`.") from None
