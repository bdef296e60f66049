"""Can a profiling run see the way out's tail? Streamed probe requests (one image, 32 tokens), each after a 0.1 s
pause, on a fresh cluster: "idle", alone; "busy", each sent 60 ms after a 120-token request, which is decoding
by then; "busy+sampler", the same with sim_fidelity_host.CoreSampler reading /proc in this process as the live
runs do. Prints each probe's way out (client TTFT - the first token's mark) percentiles in ms.

    python benchmarks/results/sim_fidelity_s30/wayout_probe.py prof|epd|colocated_prefill|stealing|adaptive

`prof` is sim_fidelity's profiling cluster (1 encode + 1 combined, pinned); the others are the layouts' live
clusters, pinned and with their policy as in sim_fidelity_live.run_layout.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx
import numpy as np

from benchmarks.sim_fidelity_host import CoreSampler
from benchmarks.sim_fidelity_layouts import LAYOUTS
from benchmarks.sim_fidelity_live import pin, put_policy
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.live_http import chat_body, served_model
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port


async def one(client: httpx.AsyncClient, model: str, i: int, tokens: int) -> ReplayRecord:
    record = ReplayRecord(SimRequest(i, 0.0, "image", 1, 1, 4, tokens))
    await stream_request(client, record, chat_body(model, 4, 1, tokens, stream=True), time.perf_counter(), 0.0)
    if record.error is not None:
        raise RuntimeError(record.error)
    return record


async def probe(url: str, busy: bool, n: int = 30, warmup: int = 3) -> list[float]:
    outs = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        model = await served_model(client)
        for i in range(warmup + n):
            await asyncio.sleep(0.1)
            background = None
            if busy:
                background = asyncio.ensure_future(one(client, model, 1000 + i, 120))
                await asyncio.sleep(0.06)
            record = await one(client, model, i, 32)
            if background is not None:
                await background
            if i >= warmup:
                outs.append(record.ttft - record.marks["first_token"])
    return outs


def main(which: str) -> None:
    if which == "prof":
        cluster = LocalCluster(ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True,
                                           key_prefix="tsx-wayout"))
    else:
        cluster = LocalCluster(LAYOUTS[which].spec())
    with cluster:
        if which != "prof":
            pin(cluster, LAYOUTS[which].pins)
            put_policy(cluster.url, LAYOUTS[which])
        groups = {name: [p.pid] for name, p in cluster.procs.items()} | {"replayer": [os.getpid()]}
        for mode in ("idle", "busy", "busy+sampler"):
            if mode == "busy+sampler":
                with CoreSampler(groups):
                    outs = asyncio.run(probe(cluster.url, busy=True))
            else:
                outs = asyncio.run(probe(cluster.url, busy=mode == "busy"))
            q = [round(float(np.percentile(outs, p)) * 1e3, 2) for p in (10, 50, 75, 90, 95)]
            print(f"{which} {mode}: way out ms p10/50/75/90/95 {q}, over 4 ms {np.mean(np.array(outs) > 0.004):.0%}",
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("prof", *LAYOUTS):
        sys.exit(__doc__)
    main(sys.argv[1])
