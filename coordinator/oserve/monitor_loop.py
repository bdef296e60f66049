"""The coordinator's side of the monitor: the flush loop and the Prometheus gauges it keeps current."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Gauge

from coordinator.oserve.monitor import WorkloadMonitor
from coordinator.protocol.process import honour_cancel

log = logging.getLogger(__name__)
GAUGE_WINDOW_S = 10
"""/metrics shows rates averaged over this many seconds (cluster-wide: read back from Redis)."""
SLO_REFRESH_S = 10.0


class WorkloadGauges:
    """tierserve_workload_* on the coordinator's /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rate = Gauge("tierserve_workload_arrival_rate", f"Arrivals per second over the last {GAUGE_WINDOW_S} s "
                          "(all coordinators), by modality", ["modality"], registry=registry)
        self.goodput = Gauge("tierserve_workload_goodput", f"Requests per second meeting the SLO over the last "
                             f"{GAUGE_WINDOW_S} s", registry=registry)
        self.attainment = Gauge("tierserve_workload_slo_attainment", f"Share of requests finished in the last "
                                f"{GAUGE_WINDOW_S} s that met the SLO", registry=registry)
        self.tokens = Gauge("tierserve_workload_tokens_per_request", f"Mean prompt and output tokens per request "
                            f"over the last {GAUGE_WINDOW_S} s", ["kind"], registry=registry)


async def run_monitor(monitor: WorkloadMonitor, gauges: WorkloadGauges, in_flight, dispatch_queue,
                      interval_s: float = 1.0) -> None:
    """Forever: flush the completed seconds, refresh the gauges, now and then the SLO in force."""
    since_slo = SLO_REFRESH_S
    while True:
        await asyncio.sleep(interval_s)
        try:
            await monitor.flush(in_flight(), dispatch_queue())
            since_slo += interval_s
            if since_slo >= SLO_REFRESH_S:
                await monitor.refresh_slo()
                since_slo = 0.0
            summary = (await monitor.window(min(GAUGE_WINDOW_S, monitor.config.retention_s))).summary()
            for modality, rate in summary["modality_rates"].items():
                gauges.rate.labels(modality).set(rate)
            gauges.goodput.set(summary["goodput"])
            if summary["slo_attainment"] is not None:
                gauges.attainment.set(summary["slo_attainment"])
            for kind in ("prompt", "output"):
                if summary[f"{kind}_tokens_mean"] is not None:
                    gauges.tokens.labels(kind).set(summary[f"{kind}_tokens_mean"])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Redis down: the counts stay pending and go out with the next flush
            honour_cancel()
            log.warning("workload monitor flush failed", extra={"error": str(e)})
