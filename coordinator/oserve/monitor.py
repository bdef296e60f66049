"""The workload monitor: per-second counters of what a coordinator sees, kept in Redis with bounded retention.

Each coordinator counts in memory (arrivals per modality, media items, prompt and output tokens, requests
finished, good ones against the SLO, failed ones) and once a second adds every completed second's counts
to that second's Redis hash (HINCRBY, so several coordinators add up), with the hash expiring after
`retention_s`. It also adds, per second, the requests in flight and those waiting in its dispatch queues.
`window(s)` reads the last `s` seconds back for GET /v1/admin/workload, the forecasters and `tierserve
replan`. The clock is injected; the request path only calls `arrived` and `finished` (no I/O there).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from coordinator.oserve.keys import OServeKeys
from coordinator.planner.goodput import SLO

log = logging.getLogger(__name__)


class MonitorConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    retention_s: int = Field(3600, ge=10)
    """Seconds of history kept in Redis (each second's hash expires this long after it was written)."""
    slo: SLO = SLO(ttft_s=2.0, tpot_s=0.2)
    """Goodput is judged against this until a plan is in force; then against the plan's SLO."""


@dataclass(frozen=True)
class WorkloadWindow:
    """The last `seconds` seconds of counters, per second and summed."""

    seconds: int
    until: int
    """The first second not included (wall clock, whole seconds)."""
    per_second: list[dict[str, float]]
    totals: dict[str, float] = field(default_factory=dict)

    def modality_rates(self) -> dict[str, float]:
        """Arrivals per second of each modality over the window."""
        return {k.split(":", 1)[1]: v / self.seconds for k, v in self.totals.items() if k.startswith("arrivals:")}

    def summary(self) -> dict:
        t, n = self.totals, self.seconds
        arrivals = sum(self.modality_rates().values()) * n
        rates = self.modality_rates()
        return {"rate": arrivals / n, "modality_rates": rates,
                "mix": {m: r * n / arrivals for m, r in rates.items()} if arrivals else {},
                "items_per_request": t.get("items", 0) / arrivals if arrivals else None,
                "prompt_tokens_mean": t.get("prompt_tokens", 0) / arrivals if arrivals else None,
                "output_tokens_mean": t.get("output_tokens", 0) / t["finished"] if t.get("finished") else None,
                "finished_per_s": t.get("finished", 0) / n, "goodput": t.get("good", 0) / n,
                "failed_per_s": t.get("failed", 0) / n,
                "slo_attainment": t.get("good", 0) / t["finished"] if t.get("finished") else None,
                "in_flight_mean": t.get("in_flight", 0) / n, "dispatch_queue_mean": t.get("dispatch_queue", 0) / n}


class WorkloadMonitor:
    def __init__(self, redis: Redis, prefix: str, config: MonitorConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.keys = OServeKeys(prefix)
        self.config = config or MonitorConfig()
        self.slo = self.config.slo
        self.clock = clock
        self.pending: dict[int, Counter] = {}
        """Counts of seconds not yet written to Redis."""
        self._gauged = -1
        """The last second whose gauges (in flight, queued) were counted: once per second, whatever the flushes."""

    def _count(self, now: float, **fields: float) -> None:
        self.pending.setdefault(int(now), Counter()).update(fields)

    def arrived(self, modality: str, items: int, prompt_tokens: int) -> None:
        """A request was admitted (modality "text" for one without media)."""
        self._count(self.clock(), **{f"arrivals:{modality}": 1, "items": items, "prompt_tokens": prompt_tokens})

    def finished(self, ok: bool, ttft_s: float | None, tpot_s: float | None, output_tokens: int) -> None:
        """A request ended: `ok` if it completed; good if it also met the SLO (TTFT, and TPOT when it had one)."""
        good = ok and ttft_s is not None and ttft_s <= self.slo.ttft_s and (tpot_s is None or tpot_s <= self.slo.tpot_s)
        self._count(self.clock(), finished=1, good=int(good), failed=int(not ok), output_tokens=output_tokens)

    async def flush(self, in_flight: int = 0, dispatch_queue: int = 0) -> int:
        """Write every completed second (and this second's gauges to the last one); returns seconds written."""
        now = int(self.clock())
        if self._gauged < now - 1:
            self._gauged = now - 1
            self._count(now - 1, in_flight=in_flight, dispatch_queue=dispatch_queue)
        done = sorted(s for s in self.pending if s < now)
        if not done:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for second in done:
            key = self.keys.workload(second)
            for name, value in self.pending[second].items():
                if value:
                    pipe.hincrbyfloat(key, name, value)
            pipe.expire(key, self.config.retention_s)
        await pipe.execute()
        for second in done:  # only once written: a Redis error keeps them for the next flush
            del self.pending[second]
        return len(done)

    async def refresh_slo(self) -> None:
        """Judge goodput by the plan in force, if one is (its SLO), else by the configured one."""
        raw = await self.redis.get(self.keys.plan_current)
        slo = self.config.slo
        if raw:
            plan = json.loads(raw).get("plan") or {}
            if plan.get("slo"):
                slo = SLO.model_validate(plan["slo"])
        self.slo = slo

    async def window(self, seconds: int) -> WorkloadWindow:
        """The last `seconds` whole seconds before the current one, read from Redis."""
        if not 1 <= seconds <= self.config.retention_s:
            raise ValueError(f"window must be 1 to {self.config.retention_s} seconds (the retention), got {seconds}")
        return await read_window(self.redis, self.keys, seconds, int(self.clock()))


async def read_window(redis: Redis, keys: OServeKeys, seconds: int, until: int) -> WorkloadWindow:
    """Counters of the seconds [until - seconds, until) as stored (missing seconds count as zero)."""
    pipe = redis.pipeline(transaction=False)
    span = range(until - seconds, until)
    for s in span:
        pipe.hgetall(keys.workload(s))
    rows = []
    totals: Counter = Counter()
    for s, raw in zip(span, await pipe.execute()):
        row = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
        totals.update(row)
        rows.append({"t": s, **row})
    return WorkloadWindow(seconds, until, rows, dict(totals))
