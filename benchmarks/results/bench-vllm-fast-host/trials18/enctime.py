import time, statistics as st, io, torch
import numpy as np
from pathlib import Path
from benchmarks.bench.media import synthetic_image
torch.set_num_threads(1)
from encode_node.encoder import LlavaImageEncoder
from encode_node.encoded import decode_image
enc = LlavaImageEncoder(Path("coordinator/assets/tiny-llava"))
print(type(enc.processor.image_processor))
rng = np.random.default_rng(0)
imgs = [synthetic_image(rng, 336, 336) for _ in range(30)]
T = {"decode": [], "proc": [], "fwd": [], "total": []}
for b in imgs * 2:
    t0 = time.perf_counter(); im = decode_image(b); t1 = time.perf_counter()
    px = enc.processor.image_processor(images=[im], return_tensors="pt")["pixel_values"]; t2 = time.perf_counter()
    with torch.inference_mode():
        out = enc.model.get_image_features(pixel_values=px)
    t3 = time.perf_counter()
    r = enc.encode([[b]]); t4 = time.perf_counter()
    for k, v in zip(T, [t1-t0, t2-t1, t3-t2, t4-t3]): T[k].append(v*1e3)
print({k: round(st.median(v), 3) for k, v in T.items()})
T = []
for b in imgs[:8]:
    time.sleep(1.0)
    r = enc.encode([[b]]); T.append(r.seconds*1e3)
print("after 1s sleep", [round(x,2) for x in T])
import os
os.sched_setaffinity(0, {0})
T = []
for b in imgs[:8]:
    time.sleep(1.0)
    r = enc.encode([[b]]); T.append(r.seconds*1e3)
print("pinned core0 after 1s sleep", [round(x,2) for x in T])
