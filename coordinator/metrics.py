"""Prometheus metrics of one coordinator, in an app-owned registry (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("tierserve_requests", "Chat requests by outcome", ["outcome"], registry=r)
        self.ttft = Histogram("tierserve_ttft_seconds", "Time to first token", buckets=_LAT, registry=r)
        self.tpot = Histogram("tierserve_tpot_seconds", "Time per output token after the first",
                              buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1), registry=r)
        self.e2e = Histogram("tierserve_e2e_seconds", "Arrival to last token", buckets=_LAT, registry=r)
        self.overhead = Histogram("tierserve_overhead_seconds",
                                  "End-to-end time outside encode/prefill/decode compute", buckets=_LAT, registry=r)
        self.reruns = Counter("tierserve_reruns", "Requests whose worker died: re-run, or failed (limit, "
                              "no_worker, redis_lost)", ["outcome"], registry=r)
        self.admission = Gauge("tierserve_admission", "Chat requests in flight now, and admitted or refused (429) "
                               "since start", ["what"], registry=r)
        self.flights = Gauge("tierserve_flights", "Requests this coordinator relays now (what a failure re-runs)",
                             registry=r)
        self.link_writes = Counter("tierserve_link_writes", "Writes between the coordinator and its workers by kind "
                                   "(reply: an LLM worker's step of token events; job: an encode micro-batch) and "
                                   "the way they went (direct link, or Redis stream)", ["kind", "path"], registry=r)
        self.tokens = Counter("tierserve_generated_tokens", "Completion tokens produced", registry=r)
        self.encode_batch = Histogram("tierserve_encode_batch_size", "Requests per released encode micro-batch",
                                      buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        self.dispatch_queue = Gauge("tierserve_dispatch_queue", "Requests held in an encode worker's open batch",
                                    ["worker"], registry=r)
        self.arrival_rate = Gauge("tierserve_arrival_rate", "Estimated arrival rate (req/s) at an encode worker",
                                  ["worker"], registry=r)
        self.worker_load = Gauge("tierserve_worker_load", "In-flight requests a worker reported",
                                 ["worker", "role"], registry=r)
        self.worker_stat = Gauge("tierserve_worker_stat", "Policy statistics a worker reported "
                                 "(offload_share, offload_realised, ...)", ["worker", "stat"], registry=r)
        self.idle_threshold = Gauge("tierserve_idle_threshold_seconds", "Adaptive batching's idle threshold g",
                                    ["worker"], registry=r)
