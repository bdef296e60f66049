"""Exactness across processes: encode worker -> transport -> prefill worker -> KV handoff -> decode worker.

The test plays the coordinator at the protocol level (so it can ask for every step's logits and pin
the LLM path), pushes several requests of different lengths at once so they share encoder batches
and engine steps, and compares tokens and logits with the same weights' own `generate()`. It runs over
every transport backend: the shared cluster (local), and a small cluster per other backend (tcp, ucx,
nixl: one encode worker, a combined worker and a prefill -> decode pair), skipped where the backend's
package is missing.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import dataclass

import pytest
import torch
from cluster_factory import serve_cluster
from media_factory import image_bytes
from PIL import Image
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import (
    EncodeJob,
    MediaRef,
    PrefillJob,
    SamplingParams,
)
from coordinator.protocol.streams import push_job
from coordinator.relay import token_events
from transport.registry import unavailable

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRANSPORTS = ["local", "tcp", "ucx", "nixl"]


@dataclass
class Ref:
    name: str
    prompt_ids: list[int]
    pngs: list[bytes]
    tokens: list[int]
    logits: list[torch.Tensor]


def _reference(model, processor, name: str, text: str, sizes: list[tuple[int, int]], n: int, seed: int) -> Ref:
    pngs = [image_bytes(seed + i, h, w) for i, (h, w) in enumerate(sizes)]
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pngs]
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(text=prompt, images=images or None, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None)
    k = inputs["input_ids"].shape[1]
    return Ref(name, inputs["input_ids"][0].tolist(), pngs, out.sequences[0, k:].tolist(),
               [s[0].float() for s in out.logits])


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport_cluster(request, redis_url, tmp_path_factory):
    """A cluster whose workers move embeddings and KV caches over one backend; one at a time, each once."""
    kind = request.param
    if kind == "local":  # the shared cluster already runs it
        yield request.getfixturevalue("cluster")
        return
    if (reason := unavailable(kind)) is not None:
        pytest.skip(reason)
    yield from serve_cluster(tmp_path_factory.mktemp(f"cluster-{kind}-logs"), encode_workers=1,
                             llm_roles=["combined", "prefill", "decode"], transport=kind, redis_url=redis_url)


@pytest.fixture(scope="module")
def refs(tiny_model):
    model, processor = tiny_model
    return [
        _reference(model, processor, "one-image", "describe the image", [(300, 200)], 9, seed=1),
        _reference(model, processor, "two-images", "tell me about the two pictures please",
                   [(224, 400), (512, 256)], 14, seed=3),
        _reference(model, processor, "long-text", "what color is the sky in this photo and what is at the left",
                   [(480, 640)], 6, seed=5),
        _reference(model, processor, "text-only", "what is this", [], 7, seed=7),
    ]


async def _run(cluster, refs: list[Ref], llm_worker: str) -> dict[str, tuple[list[int], list[torch.Tensor]]]:
    redis = Redis.from_url(cluster.redis_url)
    keys = Keys(cluster.spec.key_prefix)
    tag = f"{llm_worker}-{time.monotonic_ns()}"
    try:
        for ref in refs:  # all submitted before any is read: they batch together
            rid = f"{ref.name}-{tag}"
            sampling = SamplingParams(max_tokens=len(ref.tokens), ignore_eos=True, return_logits=True)
            if ref.pngs:
                media = [keys.media(rid, i) for i in range(len(ref.pngs))]
                for key, png in zip(media, ref.pngs):
                    await redis.set(key, png, ex=120)
                await push_job(redis, keys, "encode-0", EncodeJob(
                    request_id=rid, prompt_token_ids=ref.prompt_ids, sampling=sampling, arrival=time.time(),
                    media=[MediaRef(key=k) for k in media], prefill_worker=llm_worker))
            else:
                await push_job(redis, keys, llm_worker, PrefillJob(
                    request_id=rid, prompt_token_ids=ref.prompt_ids, sampling=sampling, arrival=time.time()))

        async def collect(ref: Ref):
            tokens, logits, workers, batch = [], [], set(), 0
            async for ev in token_events(redis, keys, f"{ref.name}-{tag}", timeout_s=60):
                assert ev.finish_reason != "error", ev.error
                tokens += ev.token_ids
                logits += [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.float32) for s in ev.logits]
                workers.add(ev.worker_id)
                batch = max(batch, ev.batch_size)
            return tokens, logits, workers, batch

        results = await asyncio.gather(*(collect(r) for r in refs))
        return {r.name: res for r, res in zip(refs, results)}
    finally:
        await redis.aclose()


@pytest.mark.parametrize("llm_worker", ["llm-1-prefill", "llm-0-combined"])
def test_disaggregated_path_matches_generate(transport_cluster, refs, logit_compare, llm_worker):
    # The point is requests sharing engine steps: some step must carry several of them. Whether
    # requests pushed together overlap depends on the machine's timing, so that gets bounded tries;
    # every try must be exact.
    for _ in range(3):
        got = asyncio.run(_run(transport_cluster, refs, llm_worker))
        problems = []
        for ref in refs:
            tokens, logits, workers, _ = got[ref.name]
            problems += logit_compare(ref.name, ref.tokens, ref.logits, tokens, logits)
            if llm_worker == "llm-1-prefill" and len(ref.tokens) > 1:
                assert workers == {"llm-1-prefill", "llm-2-decode"}, f"{ref.name} went through {workers}"
        assert not problems, "\n".join(problems)
        if max(batch for *_, batch in got.values()) >= 2:
            return
    pytest.fail("no engine step batched two requests in 3 tries")
