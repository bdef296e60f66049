"""The serving stack's CPU cost per streamed request and per token, for the host-contention model.

On a one-host CPU cluster the coordinator, Redis and the load generator run on the cores the workers
compute on, so at an offered load they slow the workers down (PerfModel.under_load). This phase
measures what they cost: CPU seconds of the given local processes plus this process (the client, as
a load generator on the same host would be) over a run of paced streaming requests, minus what they
burn idle over as long, per request; two output lengths separate the per-request and per-token parts.
Only for processes this host can see (/proc); a cluster reached by URL alone is not measured.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence

import httpx

from coordinator.planner.live_http import LiveClusterError, PromptSizer, chat_body
from coordinator.planner.profiling_phases import ProfileSettings, Tick
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest

STACK_TOKENS = (2, 64)
"""Output lengths of the two request groups (per-token cost = difference / 62)."""


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local process (all its threads); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shared_cores() -> int:
    """Cores this process may run on (the workers and the stack share them on a one-host cluster)."""
    return len(os.sched_getaffinity(0))


def _cpu(pids: Sequence[int]) -> float:
    return sum(process_cpu_s(p) for p in pids) + time.process_time()


async def stack_phase(client: httpx.AsyncClient, model: str, sizer: PromptSizer, s: ProfileSettings,
                      pids: Sequence[int], tick: Tick) -> tuple[float, float]:
    """(CPU seconds per request, per output token) of the processes `pids` plus this one."""
    start, t0 = _cpu(pids), time.perf_counter()
    await asyncio.sleep(s.stack_idle_s)
    idle_rate = (_cpu(pids) - start) / (time.perf_counter() - t0)
    per_request = []
    for tokens in STACK_TOKENS:
        body = chat_body(model, s.encode_words, 1, tokens, stream=True)
        start, t0 = _cpu(pids), time.perf_counter()
        for _ in range(s.stack_requests):
            await asyncio.sleep(s.pause_s)
            record = ReplayRecord(SimRequest(0, 0.0, "image", 1, sizer.tokens_per_image, s.encode_words, tokens))
            await stream_request(client, record, body, time.perf_counter(), 0.0)
            if record.error is not None:
                raise LiveClusterError(f"a streaming request failed while measuring the stack's CPU: {record.error}")
            tick(1)
        spent = _cpu(pids) - start - idle_rate * (time.perf_counter() - t0)
        per_request.append(max(0.0, spent) / s.stack_requests)
    per_token = max(0.0, (per_request[1] - per_request[0]) / (STACK_TOKENS[1] - STACK_TOKENS[0]))
    return max(0.0, per_request[0] - per_token * STACK_TOKENS[0]), per_token
