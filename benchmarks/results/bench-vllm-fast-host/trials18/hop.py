import asyncio, time, statistics as st, os, sys
from concurrent.futures import ThreadPoolExecutor
os.sched_setaffinity(0, {int(sys.argv[1])})
ex = ThreadPoolExecutor(1)
async def main():
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(ex, lambda: None)
    for gap in [0, 0.2, 1.0]:
        T1, T2 = [], []
        for i in range(15):
            await asyncio.sleep(gap)
            t0 = time.perf_counter(); box = {}
            def f(): box['t'] = time.perf_counter()
            await loop.run_in_executor(ex, f); t2 = time.perf_counter()
            T1.append((box['t']-t0)*1e3); T2.append((t2-box['t'])*1e3)
        print(f"gap {gap}s: into thread {st.median(T1):.3f} ms, back {st.median(T2):.3f} ms")
asyncio.run(main())
