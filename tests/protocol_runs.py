"""Requests pushed at the protocol level (playing the coordinator, so every step's logits can be asked for and
the LLM worker pinned), and the bounded-retry exactness check over them; shared by the cluster tests."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest
import torch
from mm_refs import MMRef
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import EncodeJob, MediaRef, PrefillJob, SamplingParams
from coordinator.protocol.streams import push_job
from coordinator.relay import token_events


async def collect(redis: Redis, keys: Keys, request_id: str, timeout_s: float = 90) -> tuple[list, list, int]:
    """(tokens, per-token logits, largest engine batch seen) of one request, read from its reply stream."""
    tokens, logits, batch = [], [], 0
    async for ev in token_events(redis, keys, request_id, timeout_s=timeout_s):
        assert ev.finish_reason != "error", ev.error
        tokens += ev.token_ids
        logits += [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.float32) for s in ev.logits]
        batch = max(batch, ev.batch_size)
    return tokens, logits, batch


async def run_refs(cluster, refs: list[MMRef], llm_worker: str):
    """Play the coordinator: push every ref (media through encode-0, pinned to `llm_worker`) before reading any,
    with every step's logits asked for; {name: (tokens, logits, largest engine batch seen)}."""
    redis = Redis.from_url(cluster.redis_url)
    keys = Keys(cluster.spec.key_prefix)
    tag = f"{llm_worker}-{time.monotonic_ns()}"
    try:
        for ref in refs:  # all pushed before any is read: they share micro-batches and engine steps
            rid = f"{ref.name}-{tag}"
            sampling = SamplingParams(max_tokens=len(ref.tokens), ignore_eos=True, return_logits=True)
            if ref.media:
                media = [keys.media(rid, i) for i in range(len(ref.media))]
                for key, raw in zip(media, ref.media):
                    await redis.set(key, raw, ex=120)
                await push_job(redis, keys, "encode-0", EncodeJob(
                    request_id=rid, prompt_token_ids=ref.prompt_ids, sampling=sampling, arrival=time.time(),
                    media=[MediaRef(key=k, kind=ref.modality) for k in media], prefill_worker=llm_worker))
            else:
                await push_job(redis, keys, llm_worker, PrefillJob(
                    request_id=rid, prompt_token_ids=ref.prompt_ids, sampling=sampling, arrival=time.time()))

        return dict(zip([r.name for r in refs], await asyncio.gather(
            *(collect(redis, keys, f"{r.name}-{tag}") for r in refs))))
    finally:
        await redis.aclose()


async def run_prepared(cluster, ref: MMRef, llm_worker: str, embeddings: torch.Tensor, media: list) -> tuple:
    """Play the encode worker too: send `embeddings` over the cluster's transport (with its secret) to `llm_worker`
    and hand it a PrefillJob whose per-item `media` (EncodedMedia) the test chose; (tokens, logits)."""
    from coordinator.protocol.registry import WorkerRegistry
    from transport.registry import make_sender

    redis = Redis.from_url(cluster.redis_url)
    keys = Keys(cluster.spec.key_prefix)
    rid = f"{ref.name}-prepared-{time.monotonic_ns()}"
    sender = make_sender(cluster.spec.transport, secret=cluster.cluster_secret.encode())
    try:
        (target,) = [w for w in await WorkerRegistry(redis, keys).alive() if w.info.worker_id == llm_worker]
        descs = await sender.send(target.info.transport_address, rid, {"mm_embeds": embeddings})
        await push_job(redis, keys, llm_worker, PrefillJob(
            request_id=rid, prompt_token_ids=ref.prompt_ids, arrival=time.time(), embeddings=descs, media=media,
            sampling=SamplingParams(max_tokens=len(ref.tokens), ignore_eos=True, return_logits=True)))
        tokens, logits, _ = await collect(redis, keys, rid)
        return tokens, logits
    finally:
        await sender.close()
        await redis.aclose()


def check_refs(cluster, refs, llm_worker, logit_compare, attempts: int = 3, **compare):
    """Every attempt must be exact; some attempt must have batched two requests in one engine step.

    Whether requests pushed together overlap in a step depends on the machine's timing (a loaded CI
    runner may finish one before the next arrives), so batching gets a bounded number of tries."""
    for _ in range(attempts):
        got = asyncio.run(run_refs(cluster, refs, llm_worker))
        problems = [p for r in refs for p in logit_compare(r.name, r.tokens, r.logits, got[r.name][0], got[r.name][1],
                                                  **compare)]
        assert not problems, "\n".join(problems)
        if max(b for *_, b in got.values()) >= 2:
            return
    pytest.fail(f"no engine step batched two requests in {attempts} attempts")
