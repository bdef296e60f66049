"""Ad hoc: Poisson arrivals at a rate, bench-like requests, per-stage TTFT; alternating policies on one cluster."""
import asyncio, json, sys, time, statistics as st
import httpx, numpy as np
from benchmarks.bench.workload import synthesize, MixConfig, arrival_offsets, unit_gaps
from benchmarks.bench.media import synthetic_image, data_url
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.ttft_stages import live_stages, STAGES
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port

POL = {"pass": {"name": "pass_through"}, "adwc": {"name": "adaptive", "max_batch": 8, "work_conserving": True}}

def bodies(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = synthetic_image(rng, 336, 336)
        words = " ".join(f"w{rng.integers(1000)}" for _ in range(32))
        out.append({"model": "tiny-llava", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}},
                                                             {"type": "text", "text": words}]}]})
    return out

async def run(url, rate, n, seed):
    bs = bodies(n, seed)
    rng = np.random.default_rng(seed + 1)
    offs = np.cumsum(rng.exponential(1 / rate, n))
    recs = [ReplayRecord(SimRequest(i, 0.0, "image", 1, 0, 32, 32)) for i in range(n)]
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        t0 = time.perf_counter() + 0.2
        await asyncio.gather(*(stream_request(c, r, b, t0, float(o)) for r, b, o in zip(recs, bs, offs)))
    ok = [r for r in recs if r.error is None]
    per = {s: st.median([live_stages([r])[s] * 1e3 for r in ok]) for s in STAGES}
    names = sorted({k for r in ok for k in r.marks}, key=lambda k: st.median([r.marks[k] for r in ok if k in r.marks]))
    marks = {k: round(st.median([r.marks[k] * 1e3 for r in ok if k in r.marks]), 2) for k in names}
    print("marks", json.dumps(marks), flush=True)
    ck = sorted({k for r in ok for k, v in r.compute.items() if isinstance(v, (int, float))})
    print("compute", json.dumps({k: round(st.median([r.compute[k] for r in ok if k in r.compute]) * (1e3 if k.endswith("_s") else 1), 3) for k in ck}), flush=True)
    return st.median([r.ttft * 1e3 for r in ok]), per, len(ok)

def main():
    rates = [float(x) for x in sys.argv[1].split(",")]; n = int(sys.argv[2]); reps = int(sys.argv[3])
    order = sys.argv[4].split(",")
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], pin_cores=True, port=free_port(), key_prefix="probe17")
    res = []
    with LocalCluster(spec) as cl:
        asyncio.run(run(cl.url, 4.0, 20, 999))  # warm-up
        for rep in range(reps):
            for rate in rates:
                for name in order:
                    r = httpx.put(f"{cl.url}/v1/admin/policy", json={"batch": POL[name]}, timeout=10); r.raise_for_status()
                    time.sleep(1.2)
                    ttft, per, k = asyncio.run(run(cl.url, rate, n, 100 * rep + int(rate)))
                    row = {"rep": rep, "rate": rate, "policy": name, "ttft_p50": round(ttft, 2), "ok": k,
                           **{s: round(v, 2) for s, v in per.items()}}
                    print(json.dumps(row), flush=True); res.append(row)
    json.dump(res, open(sys.argv[5], "w"))

main()
