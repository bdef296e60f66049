import asyncio, json, sys, time, statistics as st
import httpx, numpy as np
sys.path.insert(0, "/work/main/benchmarks/results/bench-vllm-fast-host/trials17")
from benchmarks.bench.media import synthetic_image, data_url
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port
def bodies(n, seed):
    rng = np.random.default_rng(seed); out = []
    for i in range(n):
        img = synthetic_image(rng, 336, 336)
        words = " ".join(f"w{rng.integers(1000)}" for _ in range(32))
        out.append({"model": "tiny-llava", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}}, {"type": "text", "text": words}]}]})
    return out
async def one(c, body, delay, rows):
    await asyncio.sleep(delay)
    t0 = time.time(); first = None; rid = None
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:]); rid = d.get("id", rid)
                ch = d.get("choices") or []
                if first is None and ch and ch[0].get("delta", {}).get("content"):
                    first = time.time()
    rows.append({"rid": rid, "sent": t0, "client": first})
async def run(url, n, seed):
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        await asyncio.gather(*(one(c, b, i * 1.0, rows) for i, b in enumerate(bodies(n, seed))))
    return rows
spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], pin_cores=True, port=free_port(), key_prefix="outp")
with LocalCluster(spec) as cl:
    asyncio.run(run(cl.url, 10, 999))
    import os
    for f in ("/tmp/s19/marks-llm.jsonl", "/tmp/s19/marks-coord.jsonl"):
        if os.path.exists(f): os.remove(f)
    rows = asyncio.run(run(cl.url, int(sys.argv[1]), 1))
llm = {}; 
for l in open("/tmp/s19/marks-llm.jsonl"): d = json.loads(l); llm[d["rid"]] = d
co = {}
for l in open("/tmp/s19/marks-coord.jsonl"):
    d = json.loads(l); co.setdefault(d["rid"], {}).update(d)
print(len(rows), len(llm), len(co), list(llm)[:2], list(co)[:2], rows[0]["rid"])
out = []
for r in rows:
    rid = r["rid"]
    m = llm.get(rid) or next((v for k, v in llm.items() if rid.endswith(k) or k.endswith(rid)), None)
    c = co.get(rid) or next((v for k, v in co.items() if rid.endswith(k) or k.endswith(rid)), None)
    if not m or not c or "read" not in c or "yield" not in c: continue
    out.append({"step_end->back": m["back"] - m["step_end"], "back->flushed": m["flushed"] - m["back"], "flushed->emit": m["emit"] - m["flushed"],
                "emit->published": m["published"] - m["emit"], "published->coord_read": c["read"] - m["published"],
                "read->yield": c["yield"] - c["read"], "yield->client": r["client"] - c["yield"], "step_end->client": r["client"] - m["step_end"], "ttft": r["client"] - r["sent"]})
print(len(out))
for k in out[0]:
    xs = [o[k] * 1e3 for o in out]
    print(f"{k:>24s} p50 {st.median(xs):7.3f}  p90 {sorted(xs)[int(0.9*len(xs))]:7.3f} ms")
