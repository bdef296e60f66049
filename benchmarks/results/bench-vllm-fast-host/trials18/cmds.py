import asyncio, json, time, sys, collections
import httpx, numpy as np, redis.asyncio as R
from benchmarks.bench.media import synthetic_image, data_url
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port
spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], pin_cores=True, port=free_port(), key_prefix="cmds18")
rng = np.random.default_rng(0)
def body():
    img = synthetic_image(rng, 336, 336)
    return {"model": "tiny-llava", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}}, {"type": "text", "text": "hello there"}]}]}
async def main(url, redis_url):
    m = R.Redis.from_url(redis_url); seen = []
    async def watch():
        async with m.monitor() as mon:
            async for c in mon.listen(): seen.append((c["time"], c["client_address"], c["client_port"], c["command"]))
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        for _ in range(3):
            async with c.stream("POST", "/v1/chat/completions", json=body()) as r:
                async for _ in r.aiter_lines(): pass
        t = asyncio.ensure_future(watch()); await asyncio.sleep(2.0)
        base = len(seen); await asyncio.sleep(2.0); idle = seen[base:]; 
        t0 = time.time(); base = len(seen)
        async with c.stream("POST", "/v1/chat/completions", json=body()) as r:
            async for _ in r.aiter_lines(): pass
        await asyncio.sleep(0.3); t1 = time.time()
        req = seen[base:]
        t.cancel()
    idle_rate = len(idle) / 2.0
    print("idle commands/s", idle_rate, "commands during request window", len(req), "window s", round(t1 - t0, 3))
    cnt = collections.Counter(x[3].split()[0] for x in req)
    icnt = collections.Counter(x[3].split()[0] for x in idle)
    print("request window:", dict(cnt)); print("idle 2s:", dict(icnt))
    for x in req:
        cmd = x[3].split()[0]
        if cmd not in ("SET", "ZADD", "PEXPIRE", "ZRANGE", "SMEMBERS", "MGET", "EXISTS") :
            print(round((x[0]-t0)*1e3, 2), x[2], x[3][:110])
with LocalCluster(spec) as cl:
    asyncio.run(main(cl.url, cl.redis_url if hasattr(cl, "redis_url") else "redis://127.0.0.1:6379/0"))
