"""What a run produced, judged against an SLO: goodput, latency percentiles, utilisation, cost per goodput.

Goodput (DESIGN "Words"): requests meeting TTFT <= T_f AND TPOT <= T_p, divided by the run's wall time,
which here is from the first arrival to the last finish. Cost per goodput = cluster $/h divided by good
requests per hour: dollars per SLO-meeting request, the planner's objective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.workload import SimRequest

STAGES = ("encode", "prefill", "decode", "stolen")
"""Kinds of GPU work a node can do; `stolen` is language work an encode GPU ran for itself."""


class SLO(BaseModel):
    """The latency targets a request must meet to count towards goodput."""

    model_config = ConfigDict(frozen=True)
    ttft_s: float = Field(gt=0.0)
    """T_f: most seconds from arrival to the first token."""
    tpot_s: float = Field(gt=0.0)
    """T_p: most seconds per output token after the first (mean over the request)."""

    def met(self, ttft: float, tpot: float) -> bool:
        return ttft <= self.ttft_s and tpot <= self.tpot_s


@dataclass(slots=True)
class RequestRecord:
    """One request's path through the simulated cluster; times are seconds since the run's start."""

    request: SimRequest
    """What was asked, and when it arrived."""
    encode_node: str = ""
    """The encode worker that took it."""
    released: float = math.nan
    """When the dispatch policy released its micro-batch."""
    encode_start: float = math.nan
    """When its micro-batch's encoder forward started."""
    encode_end: float = math.nan
    """When that forward ended (the embeddings exist)."""
    encode_batch: int = 0
    """Requests in the micro-batch it was encoded in."""
    prefill_node: str = ""
    """Where its prefill ran (an E+P node's name for a local prefill, the E node's for stolen work)."""
    local: bool = False
    """Prefilled by the worker co-located on its encode GPU (the offload share s)."""
    stolen: bool = False
    """Served entirely by its encode GPU's own engine (work stealing)."""
    prefill_start: float = math.nan
    """Start of the engine step that prefilled it."""
    first_token: float = math.nan
    """When the client has the first token: the end of that prefill step plus `to_client`."""
    to_client: float = 0.0
    """The first token's way out, worker -> coordinator -> client (sim_stack.py; 0: streamed for free)."""
    decode_node: str = ""
    """Where its last token was produced (the D node after a hand-off)."""
    finish: float = math.nan
    """When the client has its last token: the end of the step that produced it plus its way out."""

    @property
    def ttft(self) -> float:
        return self.first_token - self.request.arrival

    @property
    def tpot(self) -> float:
        """Mean seconds per token after the first; 0 for a one-token answer (nothing to pace)."""
        n = self.request.output_tokens
        return (self.finish - self.first_token) / (n - 1) if n > 1 else 0.0


@dataclass
class NodeUsage:
    """How busy one GPU was."""

    name: str
    """Node id (Deployment.names)."""
    tier: str
    """Catalog tier of its GPU."""
    role: str
    """E, E+P, P, D or P+D."""
    busy_s: float = 0.0
    """Seconds during which the GPU ran anything (overlapping work on an E+P GPU counted once)."""
    stage_busy_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    """Seconds spent on each stage (on an E+P GPU the encode and prefill seconds may overlap)."""
    stages: frozenset[str] = frozenset()
    """Stages this node is set up to run (the denominator of stage utilisation)."""


class Summary(BaseModel):
    """One run's figures of merit under one SLO."""

    model_config = ConfigDict(frozen=True)
    requests: int
    """Requests in the run."""
    good: int
    """Requests that met the SLO."""
    duration_s: float
    """First arrival to last finish."""
    throughput_rps: float
    """requests / duration."""
    goodput_rps: float
    """good / duration."""
    slo_attainment: float
    """good / requests."""
    ttft_p50_s: float
    """Median time to first token."""
    ttft_p99_s: float
    """99th-percentile time to first token."""
    ttft_mean_s: float
    """Mean time to first token."""
    tpot_mean_s: float
    """Mean over requests of each request's mean time per output token (0 for one-token answers)."""
    tpot_p99_s: float
    """99th percentile of the same."""
    mean_encode_batch: float
    """Mean micro-batch size seen by a request (request-weighted)."""
    node_utilisation: dict[str, float]
    """Per node: busy_s / duration."""
    stage_utilisation: dict[str, float]
    """Per stage: its busy seconds over all nodes that run it / (those nodes x duration)."""
    cost_per_hour: float | None
    """Sum of the nodes' $/h; None when no prices were given."""
    cost_per_goodput: float | None
    """$ per good request (inf with no good request); None when no prices were given."""


def summarize(records: Sequence[RequestRecord], slo: SLO, usage: Sequence[NodeUsage],
              price_per_hour: Mapping[str, float] | None = None) -> Summary:
    """Judge a finished run. `price_per_hour` is keyed by node name and must cover every node."""
    if not records:
        raise ValueError("no request records to summarise")
    ttft = np.fromiter((r.ttft for r in records), float, len(records))
    tpot = np.fromiter((r.tpot for r in records), float, len(records))
    if np.isnan(ttft).any() or np.isnan(tpot).any():
        unfinished = [r.request.request_id for r in records if math.isnan(r.finish)][:5]
        raise ValueError(f"some requests never finished, e.g. {unfinished}")
    start = min(r.request.arrival for r in records)
    duration = max(max(r.finish for r in records) - start, 1e-12)
    good = int(((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)).sum())
    goodput = good / duration
    stage_util = {}
    for stage in STAGES:
        hosts = [u for u in usage if stage in u.stages]
        if hosts:
            stage_util[stage] = sum(u.stage_busy_s[stage] for u in hosts) / (len(hosts) * duration)
    cost = cost_per_good = None
    if price_per_hour is not None:
        missing = sorted({u.name for u in usage} - set(price_per_hour))
        if missing:
            raise ValueError(f"no $/h for nodes {missing}; prices given for {sorted(price_per_hour)}")
        cost = sum(price_per_hour[u.name] for u in usage)
        cost_per_good = cost / (goodput * 3600.0) if goodput > 0 else math.inf
    return Summary(
        requests=len(records), good=good, duration_s=duration, throughput_rps=len(records) / duration,
        goodput_rps=goodput, slo_attainment=good / len(records),
        ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p99_s=float(np.percentile(ttft, 99)),
        ttft_mean_s=float(ttft.mean()), tpot_mean_s=float(tpot.mean()), tpot_p99_s=float(np.percentile(tpot, 99)),
        mean_encode_batch=float(np.mean([r.encode_batch for r in records])),
        node_utilisation={u.name: u.busy_s / duration for u in usage}, stage_utilisation=stage_util,
        cost_per_hour=cost, cost_per_goodput=cost_per_good,
    )
