import asyncio, json, sys, time, os
import httpx, numpy as np
sys.path.insert(0, "benchmarks/results/bench-vllm-fast-host/trials17")
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest
from benchmarks.bench.media import synthetic_image, data_url
def bodies(n, seed):
    rng = np.random.default_rng(seed); out = []
    for i in range(n):
        img = synthetic_image(rng, 336, 336); words = " ".join(f"w{rng.integers(1000)}" for _ in range(32))
        out.append({"model": "tiny-llava", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}}, {"type": "text", "text": words}]}]})
    return out
async def closed(url, n, conc):
    bs = bodies(n, 5); sem = asyncio.Semaphore(conc)
    recs = [ReplayRecord(SimRequest(i, 0.0, "image", 1, 0, 32, 32)) for i in range(n)]
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        t0 = time.perf_counter()
        async def one(r, b):
            async with sem: await stream_request(c, r, b, t0, 0.0)
        await asyncio.gather(*(one(r, b) for r, b in zip(recs, bs)))
        dt = time.perf_counter() - t0
    ok = [r for r in recs if r.error is None]
    tt = sorted(r.ttft for r in ok)
    print(json.dumps({"ok": len(ok), "req_per_s": round(len(ok) / dt, 2), "ttft_p50_ms": round(tt[len(tt)//2]*1e3, 1), "ttft_p99_ms": round(tt[int(len(tt)*0.99)]*1e3, 1)}), flush=True)
spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], pin_cores=True, port=free_port(), key_prefix="gc18")
with LocalCluster(spec) as cl:
    asyncio.run(closed(cl.url, 40, 8))
    asyncio.run(closed(cl.url, int(sys.argv[1]), 48))
