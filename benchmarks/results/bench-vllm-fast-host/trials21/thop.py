import asyncio, time, statistics as st, os, multiprocessing as mp, struct
PORT = 47123
async def reader(q):
    os.sched_setaffinity(0, {1})
    async def handle(r, w):
        while True:
            hdr = await r.readexactly(8)
            t = time.time()
            (v,) = struct.unpack("!d", hdr)
            if v < 0: q.put(None); return
            q.put((t - v) * 1e3)
    srv = await asyncio.start_server(handle, "127.0.0.1", PORT)
    q.put("ready")
    async with srv:
        await asyncio.sleep(60)
def rmain(q): asyncio.run(reader(q))
async def writer(q):
    os.sched_setaffinity(0, {0})
    r, w = await asyncio.open_connection("127.0.0.1", PORT)
    for gap in [0.02, 1.0]:
        T = []
        for i in range(12):
            await asyncio.sleep(gap)
            w.write(struct.pack("!d", time.time()))
            T.append(q.get())
        print(f"gap {gap}s: TCP write->reader woken {st.median(T):.3f} ms")
    w.write(struct.pack("!d", -1.0)); await w.drain()
q = mp.Queue(); p = mp.Process(target=rmain, args=(q,)); p.start(); assert q.get() == "ready"
asyncio.run(writer(q)); p.terminate()
