"""The plan file (DESIGN "Contracts"): what `tierserve plan` decided, for `tierserve up`, the admin endpoint
and deploy/ to consume.

A versioned YAML document: the cluster's nodes (host, GPU index, tier, role), the policy knobs as the
coordinator stores them (a PolicyConfig), the engines' batching limits, the SLO and the workload it
was planned for, the prices it was costed with, its predicted goodput and cost, and how the search
went. `load_plan` turns every problem into a PlanFileError naming the file, the field and the fix.
"""

from __future__ import annotations

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

    @property
    def name(self) -> str:
        return f"{self.host}/gpu{self.gpu_index}"


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
        self.allocation()  # raises if some stage has no GPU
        return self

    def allocation(self) -> Allocation:
        """The nodes as an Allocation (roles counted per tier)."""
        return Allocation.of(*((1, n.tier, n.role) for n in self.nodes))

    def cost_per_hour(self) -> float:
        return sum(self.prices[n.tier] for n in self.nodes)

    def deployment(self) -> Deployment:
        """The plan as the simulator (and the launcher) take a deployment."""
        return Deployment(nodes=[GPUNode(tier=n.tier, role=n.role, host=n.host, name=n.name, tpcs=n.tpcs)
                                 for n in self.nodes],
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
