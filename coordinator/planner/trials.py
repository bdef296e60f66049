"""Trial backends: deploy one TrialConfig, replay the planned workload, report what came out.

Every searcher (HAS, Random, Coordinate) only calls `TrialBackend.evaluate`, so a search runs the same
on the simulator or on a live cluster:
- "sim" (SimBackend): the discrete-event simulator over the same requests every trial (common random
  numbers: two configurations are compared on identical traffic), memoised by configuration.
- "live" (LiveBackend, live.py): applies the knobs through the coordinator's PUT /v1/admin/policy, then
  replays the workload through an injected `Replayer`.

The objective is good requests per dollar: goodput (req/h meeting the SLO) / cluster $/h, the inverse
of DESIGN's cost per goodput. Higher is better, and a run with no good request scores 0, not inf.
"""

from __future__ import annotations

import math
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.allocation import Allocation, worker_price
from coordinator.planner.arch import ModelArch
from coordinator.planner.capacity import RequestShape
from coordinator.planner.catalog import Catalog
from coordinator.planner.deployment import Deployment, EngineLimits, GPUNode
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.scenarios import engine_limits
from coordinator.planner.service import ServiceTimes
from coordinator.planner.sim import Simulator
from coordinator.planner.space import TrialConfig
from coordinator.planner.workload import Workload


class TrialOutcome(BaseModel):
    """What one trial measured (or simulated)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")  # cost_per_goodput may be inf

    objective: float = Field(ge=0)
    """Good requests per dollar: goodput x 3600 / cost_per_hour (what every searcher maximises)."""
    goodput_rps: float = Field(ge=0)
    """Requests meeting the SLO per second of the run."""
    throughput_rps: float = Field(ge=0)
    """Requests finished per second of the run."""
    slo_attainment: float = Field(ge=0, le=1)
    """Share of requests meeting the SLO."""
    ttft_mean_s: float
    """Mean time to first token (the first tie-breaker)."""
    ttft_p50_s: float
    """Median time to first token."""
    ttft_p99_s: float
    """99th-percentile time to first token."""
    tpot_mean_s: float
    """Mean time per output token (the second tie-breaker)."""
    tpot_p99_s: float
    """99th-percentile time per output token."""
    cost_per_hour: float = Field(gt=0)
    """The deployment's price, $/h."""
    cost_per_goodput: float
    """$ per request meeting the SLO (inf when none did)."""
    requests: int = Field(ge=1)
    """Requests replayed."""
    backend: str
    """Which backend produced it ("sim", "live")."""

    @classmethod
    def from_summary(cls, summary: Summary, cost_per_hour: float, backend: str) -> TrialOutcome:
        if cost_per_hour <= 0:
            raise ValueError(f"cost_per_hour must be > 0 to plan by goodput per dollar, got {cost_per_hour!r}; "
                             f"give the tier a price in a user catalog file")
        good_per_hour = summary.goodput_rps * 3600.0
        return cls(objective=good_per_hour / cost_per_hour, goodput_rps=summary.goodput_rps,
                   throughput_rps=summary.throughput_rps, slo_attainment=summary.slo_attainment,
                   ttft_mean_s=summary.ttft_mean_s, ttft_p50_s=summary.ttft_p50_s, ttft_p99_s=summary.ttft_p99_s,
                   tpot_mean_s=summary.tpot_mean_s, tpot_p99_s=summary.tpot_p99_s, cost_per_hour=cost_per_hour,
                   cost_per_goodput=cost_per_hour / good_per_hour if good_per_hour > 0 else math.inf,
                   requests=summary.requests, backend=backend)

    def rank_key(self) -> tuple[float, float, float]:
        """Sort key, best first: objective, then mean TTFT, then mean TPOT (the seeds' tie-break)."""
        return (-self.objective, self.ttft_mean_s, self.tpot_mean_s)


class TrialBackend(Protocol):
    """Runs one trial. Implementations: SimBackend here, LiveBackend in live.py."""

    name: str

    def evaluate(self, config: TrialConfig) -> TrialOutcome: ...


class SimSettings(BaseModel):
    """How simulated trials run."""

    model_config = ConfigDict(frozen=True)

    requests: int = Field(100, ge=1)
    """Requests per trial (EAServe: 100)."""
    workload_seed: int = 0
    """Seed of the request stream; the same for every trial of a search."""
    host: str = "node0"
    """Host every GPU is placed on: embeddings cross PCIe, same-tier NVLink GPUs use NVLink."""
    max_num_seqs: int = Field(32, ge=1)
    """Engine sequence cap before memory limits it (llm_node's default)."""


def allocation_nodes(catalog: Catalog, allocation: Allocation, host: str) -> list[GPUNode]:
    """One GPUNode per worker, named by its first GPU as the plan file numbers GPUs ("node0/gpu3"); a
    tensor-parallel worker spans tp GPUs and is timed under its service key (variants.py)."""
    nodes, gpu = [], 0
    for group in allocation.groups:
        tpcs = catalog.tier(group.tier).tpcs
        for _ in range(group.workers):
            nodes.append(GPUNode(tier=group.key, role=group.role, host=host, name=f"{host}/gpu{gpu}", tpcs=tpcs))
            gpu += group.variant.tp
    return nodes


class SimBackend:
    """Trials on the discrete-event simulator."""

    name = "sim"

    def __init__(self, catalog: Catalog, arch: ModelArch, service: ServiceTimes, workload: Workload, slo: SLO,
                 shape: RequestShape, settings: SimSettings | None = None) -> None:
        self.catalog = catalog
        self.arch = arch
        self.service = service
        self.workload = workload
        self.slo = slo
        self.shape = shape
        self.settings = settings or SimSettings()
        self.requests = workload.generate(self.settings.requests, seed=self.settings.workload_seed)
        self._memo: dict[str, TrialOutcome] = {}
        self.runs = 0
        """Simulations actually run (a repeated configuration is answered from the memo)."""

    def engine(self, allocation: Allocation, longest_prompt: int) -> EngineLimits:
        tiers = sorted({g.key for g in allocation.groups if g.role != "E"})
        return engine_limits(self.catalog, self.arch, self.shape, tiers, longest_prompt, self.settings.max_num_seqs)

    def deployment(self, config: TrialConfig, longest_prompt: int | None = None) -> Deployment:
        """The simulated deployment of `config` (also what a plan file describes)."""
        policy = config.knobs.policy()
        longest = longest_prompt or max(r.prompt_tokens for r in self.requests)
        return Deployment(nodes=allocation_nodes(self.catalog, config.allocation, self.settings.host),
                          batch=policy.batch, offload=policy.offload, partition=policy.partition,
                          stealing=policy.stealing, engine=self.engine(config.allocation, longest))

    def run(self, config: TrialConfig, requests: int | None = None,
            seed: int | None = None) -> tuple[Deployment, Summary]:
        """Simulate `config` on the trial's own requests, or on another stream when `requests`/`seed` are
        given (the plan's prediction re-runs the winner on a longer, unseen stream)."""
        reqs = self.requests if requests is None and seed is None else self.workload.generate(
            requests or self.settings.requests, seed=self.settings.workload_seed if seed is None else seed)
        dep = self.deployment(config, max(r.prompt_tokens for r in reqs))
        sim = Simulator(dep, self.service, kv_bytes_per_token=self.arch.kv_bytes_per_token(),
                        embedding_bytes_per_token=self.arch.embedding_bytes(1))
        self.runs += 1
        prices = {n.tier: worker_price(self.catalog, n.tier) for n in dep.nodes}
        return dep, sim.run(reqs).summary(self.slo, dep.node_prices(prices))

    def evaluate(self, config: TrialConfig) -> TrialOutcome:
        key = config.label()
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = TrialOutcome.from_summary(
                self.run(config)[1], config.allocation.cost_per_hour(self.catalog), self.name)
        return found
