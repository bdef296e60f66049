"""Open-loop replay of a workload against a live cluster, judged at the client: the live trial's Replayer.

Request i is sent at t0 + (arrival_i - arrival_0) whatever the earlier ones are doing (open loop, as
production traffic arrives; a closed loop would hide queueing). Every request streams: TTFT runs from
its send to the first chunk with content, E2E to the chunk that finishes it, and
TPOT = (E2E - TTFT) / (n - 1) over its n output tokens (usage.completion_tokens), as the simulator
defines them (goodput.py). Requests have the workload's own lengths: the prompt is sized by a
PromptSizer (probe requests learn the chat template's and an image's tokens), the output fixed by
max_tokens with ignore_eos. The run's wall time is the first send to the last finish, as in the
simulator, so a replay and a simulation of the same `Workload.generate(n, seed)` compare directly.

Only image workloads replay for now (LLaVA-style: one fixed token count per image); video and audio
requests are refused with a clear error rather than replayed as something else.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.live_http import (
    CHAT_PATH,
    LiveClusterError,
    PromptSizer,
    chat_body,
    mark_offsets,
    served_model,
)
from coordinator.planner.workload import SimRequest, Workload


class ReplaySettings(BaseModel):
    """How a replay talks to the cluster."""

    model_config = ConfigDict(frozen=True)

    model: str | None = None
    """Model name to request; None: the first one GET /v1/models lists."""
    timeout_s: float = Field(300.0, gt=0)
    """Per request, from send to the last token."""
    lead_s: float = Field(0.2, ge=0)
    """Delay before the first send, so that building the tasks never delays early requests."""


@dataclass
class ReplayRecord:
    """One request as the client saw it; times in seconds."""

    request: SimRequest
    """What the workload asked for."""
    sent: float = math.nan
    """Send time, seconds after the replay's t0."""
    ttft: float = math.nan
    """Send -> first content chunk."""
    e2e: float = math.nan
    """Send -> the chunk with finish_reason."""
    output_tokens: int = 0
    """usage.completion_tokens (the content chunks counted when usage is missing)."""
    prompt_tokens: int = 0
    """usage.prompt_tokens: compare with request.prompt_tokens."""
    error: str | None = None
    """Why the request failed; None when it finished."""
    marks: dict[str, float] = field(default_factory=dict)
    """The coordinator's per-hop marks (live_http.mark_offsets: seconds since it received the request),
    from the usage chunk's `tierserve` record; empty from a server that sends none."""
    compute: dict[str, float] = field(default_factory=dict)
    """The same record's worker compute seconds (encode_s, prefill_s, decode_s: sums of the engine steps the
    request was in, ...): what splits a live TPOT into step compute and the time between steps."""

    @property
    def ok(self) -> bool:
        return self.error is None and not math.isnan(self.ttft)

    @property
    def tpot(self) -> float:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


async def stream_request(client: httpx.AsyncClient, record: ReplayRecord, body: dict, t0: float, at: float) -> None:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    record.sent = sent - t0
    first = last = None
    chunks = 0
    try:
        async with client.stream("POST", CHAT_PATH, json=body) as r:
            if r.status_code != 200:
                record.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = str(chunk["error"].get("message", chunk["error"]))
                    return
                if chunk.get("usage"):
                    record.output_tokens = chunk["usage"]["completion_tokens"]
                    record.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    record.marks = mark_offsets((chunk.get("tierserve") or {}).get("stages_s") or {})
                    record.compute = (chunk.get("tierserve") or {}).get("compute") or {}
                for choice in chunk.get("choices", ()):
                    if choice.get("delta", {}).get("content"):
                        first = first or now
                        last = now
                        chunks += 1
                    if choice.get("finish_reason"):
                        last = now
    except (httpx.HTTPError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return
    if first is None:
        record.error = "the stream ended without a token"
        return
    record.ttft, record.e2e = first - sent, last - sent
    record.output_tokens = record.output_tokens or chunks


async def _encode_batches(client: httpx.AsyncClient) -> tuple[float, float]:
    """(requests, micro-batches) the coordinator has released so far, from /metrics; zeros if absent."""
    try:
        text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return 0.0, 0.0
    found = {}
    for line in text.splitlines():
        for name in ("sum", "count"):
            if line.startswith(f"tierserve_encode_batch_size_{name} "):
                found[name] = float(line.split()[1])
    return found.get("sum", 0.0), found.get("count", 0.0)


def summarize_replay(records: Sequence[ReplayRecord], slo: SLO, mean_encode_batch: float = 0.0) -> Summary:
    """The live counterpart of goodput.summarize: failed requests count, but never as good."""
    ok = [r for r in records if r.ok]
    if not ok:
        errors = sorted({r.error or "no token" for r in records})[:3]
        raise LiveClusterError(f"all {len(records)} replayed requests failed, e.g. {errors}")
    ttft = np.array([r.ttft for r in ok])
    tpot = np.array([r.tpot for r in ok])
    start = min(r.sent for r in records)
    duration = max(max(r.sent + r.e2e for r in ok) - start, 1e-12)
    good = int(((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)).sum())
    return Summary(
        requests=len(records), good=good, duration_s=duration, throughput_rps=len(ok) / duration,
        goodput_rps=good / duration, slo_attainment=good / len(records),
        ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p99_s=float(np.percentile(ttft, 99)),
        ttft_mean_s=float(ttft.mean()), tpot_mean_s=float(tpot.mean()), tpot_p99_s=float(np.percentile(tpot, 99)),
        mean_encode_batch=mean_encode_batch, node_utilisation={}, stage_utilisation={},
        cost_per_hour=None, cost_per_goodput=None)


class HttpReplayer:
    """Replays workloads through the coordinator at `url` (LiveBackend's default Replayer)."""

    def __init__(self, url: str, settings: ReplaySettings | None = None,
                 on_done: Callable[[ReplayRecord], None] | None = None, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.settings = settings or ReplaySettings()
        self.on_done = on_done
        """Called as each request finishes (a progress bar)."""
        self.headers = headers or {}
        self.sizer: PromptSizer | None = None
        """Learnt on the first replay, then reused (the model does not change between trials)."""
        self.last_records: list[ReplayRecord] = []
        """The latest replay's requests, for callers that want more than the Summary."""

    def replay(self, workload: Workload, requests: int, seed: int, slo: SLO) -> Summary:
        """Replayer protocol: `requests` requests of `workload`'s stream `seed`, judged under `slo`."""
        records, mean_batch = self.run(workload.generate(requests, seed))
        return summarize_replay(records, slo, mean_batch)

    def run(self, requests: Sequence[SimRequest]) -> tuple[list[ReplayRecord], float]:
        """Replay `requests` (in arrival order); returns their records and the mean micro-batch size
        (requests per released batch, from the coordinator's metrics; 0 when it has none)."""
        if not requests:
            raise ValueError("nothing to replay: the request list is empty")
        others = sorted({r.modality for r in requests} - {"image"})
        if others:
            raise LiveClusterError(f"live replay sends image requests only; this workload also has {others}. "
                                   f"Replay an image workload, or use the sim backend")
        records, mean_batch = asyncio.run(self._run(list(requests)))
        self.last_records = records
        return records, mean_batch

    async def _run(self, requests: list[SimRequest]) -> tuple[list[ReplayRecord], float]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=self.settings.timeout_s, limits=limits,
                                     headers=self.headers) as client:
            model = self.settings.model or await served_model(client)
            if self.sizer is None:
                self.sizer = await PromptSizer.calibrate(client, model)
            sizer = self.sizer
            records = [ReplayRecord(r) for r in requests]
            bodies = [chat_body(model, sizer.words_for(r.prompt_tokens, r.items), r.items, r.output_tokens, stream=True)
                      for r in requests]
            before = await _encode_batches(client)
            t0 = time.perf_counter() + self.settings.lead_s
            first = requests[0].arrival

            async def one(i: int) -> None:
                await stream_request(client, records[i], bodies[i], t0, requests[i].arrival - first)
                if self.on_done is not None:
                    self.on_done(records[i])

            await asyncio.gather(*(one(i) for i in range(len(requests))))
            after = await _encode_batches(client)
        batches = after[1] - before[1]
        return records, (after[0] - before[0]) / batches if batches > 0 else 0.0
