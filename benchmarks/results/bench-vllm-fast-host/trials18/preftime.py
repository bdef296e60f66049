import time, statistics as st, torch, json, os
import numpy as np
from pathlib import Path
from benchmarks.bench.media import synthetic_image
torch.set_num_threads(1)
os.sched_setaffinity(0, {1})
from encode_node.encoder import LlavaImageEncoder
from llm_node.config import LLMWorkerConfig
from llm_node.engines import build_engine
from llm_node.engine_api import EngineRequest
from coordinator.prompt import PromptBuilder
from coordinator.api.chat import _parse
from coordinator.protocol.messages import SamplingParams
enc = LlavaImageEncoder(Path("coordinator/assets/tiny-llava"))
pb = PromptBuilder.from_model_dir("coordinator/assets/tiny-llava")
eng = build_engine(LLMWorkerConfig(model_dir="coordinator/assets/tiny-llava", worker_id="x")).engine
rng = np.random.default_rng(0)
from benchmarks.bench.media import data_url
reqs = []
for i in range(12):
    img = synthetic_image(rng, 336, 336)
    words = " ".join(f"w{rng.integers(1000)}" for _ in range(32))
    body = json.dumps({"model": "tiny-llava", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img, "image/jpeg")}}, {"type": "text", "text": words}]}]})
    built = pb.build(_parse(body.encode()))
    emb = enc.encode([[built.media[0].data]]).per_request[0]
    reqs.append((built, emb))
print("prompt len", len(reqs[0][0].prompt_token_ids))
def one(i, built, emb):
    r = EngineRequest(f"r{i}", built.prompt_token_ids, SamplingParams(max_tokens=1, temperature=0), mm_embeddings=emb, media=list(built.media and []))
    eng.add(r); t = time.perf_counter(); outs = eng.step(); d = time.perf_counter() - t
    while eng.has_unfinished(): eng.step()
    return d * 1e3, outs[0].prefill_s * 1e3
for mode in []:
    T = []
    for i, (b, e) in enumerate(reqs * 2):
        if mode != "warm": time.sleep(1.0)
        if mode == "sleep+warmup": one(1000+i, b, e); 
        T.append(one(i, b, e))
    print(mode, "step ms", round(st.median([x for x, _ in T]), 2), "prefill_s ms", round(st.median([y for _, y in T]), 2))
import cProfile, pstats
def addonly(i, built, emb):
    r = EngineRequest(f"a{i}", built.prompt_token_ids, SamplingParams(max_tokens=1, temperature=0), mm_embeddings=emb)
    t = time.perf_counter(); eng.add(r); d = time.perf_counter() - t
    eng.abort(f"a{i}")
    return d * 1e3
print("add warm ms", st.median([addonly(i, b, e) for i, (b, e) in enumerate(reqs * 3)]))
pr = cProfile.Profile(); pr.enable()
for i, (b, e) in enumerate(reqs * 3): addonly(100 + i, b, e)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
