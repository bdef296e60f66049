import json, time, asyncio, statistics as st, base64
import numpy as np
from benchmarks.bench.media import synthetic_image, data_url
from coordinator.api.chat import _parse
from coordinator.prompt import PromptBuilder
import coordinator.api.chat as chat
rng = np.random.default_rng(0)
bodies = []
for i in range(60):
    img = synthetic_image(rng, 336, 336)
    words = " ".join(f"w{rng.integers(1000)}" for _ in range(32))
    bodies.append(json.dumps({"model": "tiny-llava", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}},
                                                 {"type": "text", "text": words}]}]}).encode())
print("body bytes", len(bodies[0]))
pb = PromptBuilder.from_model_dir("coordinator/assets/tiny-llava")
def t(f, *a):
    s = time.perf_counter(); r = f(*a); return r, (time.perf_counter() - s) * 1e3
P, B, J = [], [], []
for b in bodies:
    req, dp = t(_parse, b); P.append(dp)
    built, db = t(pb.build, req); B.append(db)
    _, dj = t(lambda: json.loads(b)); J.append(dj)
print("parse(json+pydantic) ms", st.median(P), "json only", st.median(J), "build ms", st.median(B))
# break build down
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for b in bodies * 3:
    pb.build(_parse(b))
pr.disable()
pstats.Stats(pr).sort_stats("cumtime").print_stats(25)
