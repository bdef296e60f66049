"""Qwen2-VL (image, video) and Qwen2-Audio served by real local clusters, one per architecture.

- Exactness across processes: encode worker -> transport (embeddings + grids in the PrefillJob) ->
  prefill worker -> KV hand-off (with the rope delta) -> decode worker, requests of different sizes
  submitted together so they share encoder micro-batches and engine steps; tokens and every step's
  logits equal the model's own generate() on raw inputs.
- The `openai` client sends an image, a video and an audio request and gets answers.
- Bad media get a 4xx with a reason.
"""

from __future__ import annotations

import base64

import httpx
import pytest
import torch
from cluster_factory import serve_cluster
from media_factory import data_url, image_bytes, wav_bytes
from mm_refs import MMRef, pcm, qwen2_audio_ref, qwen2_vl_ref
from protocol_runs import check_refs
from test_direct_links_live import link_writes

from coordinator.protocol.models import QWEN2_AUDIO_DIR, QWEN2_VL_DIR

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _serve(redis_url, tmp_path_factory, model_dir, name, *extra):
    yield from serve_cluster(tmp_path_factory.mktemp(f"logs-{name}"), encode_workers=1,
                             llm_roles=["combined", "prefill", "decode"], model_dir=model_dir, redis_url=redis_url,
                             coordinator_args=["--batch-policy", "queue_length", "--queue-length", "3",
                                               "--max-audio-seconds", "4", *extra])


@pytest.fixture(scope="module")
def vl_cluster(redis_url, tmp_path_factory):
    yield from _serve(redis_url, tmp_path_factory, QWEN2_VL_DIR, "vl")


@pytest.fixture(scope="module")
def audio_cluster(redis_url, tmp_path_factory):
    """Its coordinator talks to the workers through Redis alone (no direct links): the streams' path stays
    checked end to end, exactness included (test_direct_links_live.py checks the links' on the others)."""
    yield from _serve(redis_url, tmp_path_factory, QWEN2_AUDIO_DIR, "audio", "--no-direct-links")


@pytest.fixture(scope="module")
def vl_refs() -> list[MMRef]:
    from transformers import AutoImageProcessor, AutoTokenizer

    from llm_node.architectures import load_model

    torch.set_num_threads(2)
    model, tok = load_model(QWEN2_VL_DIR), AutoTokenizer.from_pretrained(QWEN2_VL_DIR)
    ip = AutoImageProcessor.from_pretrained(QWEN2_VL_DIR)
    return [qwen2_vl_ref(model, tok, ip, "one-image", "describe the image", 8, images=[(1, 300, 200)]),
            qwen2_vl_ref(model, tok, ip, "two-images", "tell me about the two pictures", 11,
                         images=[(2, 224, 400), (3, 100, 100)]),
            qwen2_vl_ref(model, tok, ip, "small-image", "what color", 6, images=[(4, 60, 60)]),
            qwen2_vl_ref(model, tok, ip, "video", "what happens", 9, videos=[(5, 3, 120, 160)]),
            qwen2_vl_ref(model, tok, ip, "video-4", "what happens at the left", 7, videos=[(6, 4, 60, 90)]),
            qwen2_vl_ref(model, tok, ip, "text-only", "what is this", 5)]


@pytest.fixture(scope="module")
def audio_refs() -> list[MMRef]:
    from transformers import AutoProcessor

    from llm_node.architectures import load_model

    model, processor = load_model(QWEN2_AUDIO_DIR), AutoProcessor.from_pretrained(QWEN2_AUDIO_DIR)
    return [qwen2_audio_ref(model, processor, "one-second", "what is this sound", 8, [(1, 1.0)]),
            qwen2_audio_ref(model, processor, "two-clips", "compare the two sounds", 10, [(2, 2.5), (3, 0.4)]),
            qwen2_audio_ref(model, processor, "short", "describe", 6, [(4, 0.3)]),
            qwen2_audio_ref(model, processor, "text-only", "what is this", 5, [])]


@pytest.mark.parametrize("llm_worker", ["llm-1-prefill", "llm-0-combined"])
def test_qwen2_vl_disaggregated_matches_generate(vl_cluster, vl_refs, logit_compare, llm_worker):
    check_refs(vl_cluster, vl_refs, llm_worker, logit_compare)


@pytest.mark.parametrize("llm_worker", ["llm-1-prefill", "llm-0-combined"])
def test_qwen2_audio_disaggregated_matches_generate(audio_cluster, audio_refs, logit_compare, llm_worker):
    check_refs(audio_cluster, audio_refs, llm_worker, logit_compare)


def _client(cluster):
    from openai import OpenAI

    return OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(cluster, *parts):
    out = _client(cluster).chat.completions.create(
        model=cluster.spec.model_name, max_tokens=6, temperature=0,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "what is this?"}]}])
    assert out.choices[0].message.content and out.usage.completion_tokens > 0
    return out


def test_openai_client_image_video_and_audio(vl_cluster, audio_cluster):
    image = _ask(vl_cluster, {"type": "image_url", "image_url": {"url": data_url(image_bytes(7, 200, 300))}})
    video = _ask(vl_cluster, {"type": "video", "video": [data_url(image_bytes(8 + i, 90, 120)) for i in range(4)]})
    clip = base64.b64encode(wav_bytes(pcm(9, 1.5, 44100), 44100, channels=2)).decode()
    audio = _ask(audio_cluster, {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}})
    assert image.usage.prompt_tokens > 40 and video.usage.prompt_tokens > 40 and audio.usage.prompt_tokens > 40
    writes = link_writes(audio_cluster.url)
    assert writes[("job", "stream")] >= 1 and writes[("reply", "stream")] >= 1
    assert writes.get(("job", "direct"), 0) == 0 and writes.get(("reply", "direct"), 0) == 0


def _post_error(cluster, *parts) -> dict:
    body = {"model": cluster.spec.model_name, "max_tokens": 2,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}]}
    r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    return r.json()["error"]


def test_bad_media_get_a_4xx_with_a_reason(vl_cluster, audio_cluster):
    jpeg = image_bytes(1, 64, 64, "JPEG")
    assert "corrupt" in _post_error(vl_cluster, {"type": "image_url", "image_url": {"url": data_url(
        jpeg[: len(jpeg) // 3], "image/jpeg")}})["message"]
    many = [data_url(image_bytes(i, 32, 32)) for i in range(33)]
    assert "the limit is 32" in _post_error(vl_cluster, {"type": "video", "video": many})["message"]
    png = base64.b64encode(image_bytes(2, 8, 8)).decode()
    err = _post_error(audio_cluster, {"type": "input_audio", "input_audio": {"data": png, "format": "wav"}})
    assert "not a WAV file" in err["message"] and err["param"].endswith("input_audio.data")
    long = base64.b64encode(wav_bytes(pcm(3, 4.5))).decode()
    assert "the limit is 4 s" in _post_error(
        audio_cluster, {"type": "input_audio", "input_audio": {"data": long, "format": "wav"}})["message"]
