"""Speed-controlled partial offload on the live cluster: a share s of prefills runs on the encode
GPU's co-located prefill worker, the rest remotely, switched at run time."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from media_factory import data_url, image_bytes

pytestmark = [pytest.mark.redis, pytest.mark.slow]
N = 40


async def _prefill_workers(base: str, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        sem = asyncio.Semaphore(4)

        async def one(i: int) -> str:
            async with sem:
                r = await client.post("/v1/chat/completions", json={
                    "model": "tiny-llava", "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": data_url(image_bytes(i, 32, 32))}}, {"type": "text", "text": "hi"}]}]})
                assert r.status_code == 200, r.text
                return r.json()["tierserve"]["prefill_worker"]
        return await asyncio.gather(*(one(i) for i in range(n)))


def _set_share(cluster, s: float) -> None:
    r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"offload": {"s": s}}, timeout=10)
    assert r.status_code == 200 and r.json()["offload"]["s"] == s, r.text
    time.sleep(1.2)  # encode workers re-read the policy at most once a second


@pytest.mark.parametrize("s", [0.0, 0.3, 0.7, 1.0])
def test_realised_local_share_follows_s(cluster, s):
    try:
        _set_share(cluster, s)
        workers = asyncio.run(_prefill_workers(cluster.url, N))
        local = workers.count("llm-local-0") / N
        # The router's schedule is exact to one request per window (tests/coordinator/test_offload_router.py);
        # here the window is this run's 40 requests.
        assert abs(local - s) <= 1 / N + 1e-9, (s, local, workers)
        assert set(workers) - {"llm-local-0"} <= {"llm-0-combined", "llm-1-prefill"}
        time.sleep(2.5)  # the next heartbeat carries the encode worker's stats
        metrics = httpx.get(f"{cluster.url}/metrics", timeout=10).text
        line = next(x for x in metrics.splitlines()
                    if x.startswith('tierserve_worker_stat{') and 'stat="offload_realised"' in x)
        assert abs(float(line.split()[-1]) - s) <= 0.05, line
    finally:
        _set_share(cluster, 0.0)


def test_out_of_range_share_is_refused(cluster):
    r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"offload": {"s": 1.5}}, timeout=10)
    assert r.status_code == 400 and "offload.s" in r.json()["error"]["message"]
