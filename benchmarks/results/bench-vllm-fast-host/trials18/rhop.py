import asyncio, time, statistics as st, os, sys, multiprocessing as mp
import redis.asyncio as R
KEY = "s18:hop"
async def reader(q):
    os.sched_setaffinity(0, {1})
    r = R.Redis()
    last = "$"
    while True:
        res = await r.xread({KEY: last}, block=5000, count=1)
        if not res: continue
        t = time.time()
        (_, entries), = res
        last, fields = entries[-1]
        if fields[b"t"] == b"stop": return
        q.put((t - float(fields[b"t"])) * 1e3)
def rmain(q): asyncio.run(reader(q))
async def writer(q):
    os.sched_setaffinity(0, {0})
    r = R.Redis(); await r.ping()
    for gap in [0.02, 1.0]:
        T, W = [], []
        for i in range(12):
            await asyncio.sleep(gap)
            t0 = time.time(); await r.xadd(KEY, {"t": repr(t0)}, maxlen=100); W.append((time.time()-t0)*1e3)
            T.append(q.get())
        print(f"gap {gap}s: XADD round trip {st.median(W):.3f} ms, XADD->reader woken {st.median(T):.3f} ms")
    await r.xadd(KEY, {"t": "stop"})
q = mp.Queue(); p = mp.Process(target=rmain, args=(q,)); p.start(); time.sleep(0.5)
asyncio.run(writer(q)); p.join()
