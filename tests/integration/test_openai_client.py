"""The official `openai` client against a live coordinator: an image request, plain and streamed."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PROMPT = "What is in this image?"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(11).integers(0, 256, (180, 240, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def expected(tiny_model, png):
    """What the same weights' generate() says, greedy, decoded as the server decodes (no specials)."""
    model, processor = tiny_model
    image = Image.open(io.BytesIO(png)).convert("RGB")
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}], add_generation_prompt=True)
    inputs = processor(text=prompt, images=image, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    ids = out[0, inputs["input_ids"].shape[1]:].tolist()
    eos = processor.tokenizer.eos_token_id
    finish = "stop" if eos in ids else "length"
    ids = ids[: ids.index(eos)] if eos in ids else ids
    return processor.tokenizer.decode(ids, skip_special_tokens=True), len(ids), finish, inputs["input_ids"].shape[1]


def _messages(png: bytes) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": PROMPT}]}]


@pytest.fixture(scope="module")
def client(cluster):
    from openai import OpenAI

    return OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_non_streaming_image_answer(client, png, expected):
    text, n, finish, prompt_tokens = expected
    r = client.chat.completions.create(model="tiny-llava", messages=_messages(png), max_tokens=MAX_TOKENS,
                                       temperature=0)
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == finish
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens == n
    assert r.usage.total_tokens == prompt_tokens + n


def test_streaming_image_answer(client, png, expected):
    text, n, finish, prompt_tokens = expected
    stream = client.chat.completions.create(model="tiny-llava", messages=_messages(png), max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [finish]
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n
    assert chunks[-1].usage.prompt_tokens == prompt_tokens


def test_models_and_cluster_endpoints(client, cluster):
    import httpx

    assert [m.id for m in client.models.list()] == ["tiny-llava"]
    workers = httpx.get(f"{cluster.url}/v1/cluster", timeout=5).json()["workers"]
    assert sorted(w["role"] for w in workers) == ["combined", "combined", "decode", "encode", "prefill", "prefill"]
    colocated = {w["worker_id"]: w["colocated_with"] for w in workers}
    assert colocated["llm-local-0"] == colocated["llm-steal-0"] == "encode-0"
    assert all(w["tier"] == "cpu" and 0 <= w["heartbeat_age_s"] < 10 for w in workers)
    health = httpx.get(f"{cluster.url}/health", timeout=5).json()
    assert health["status"] == "ok" and health["workers"] == 6
    metrics = httpx.get(f"{cluster.url}/metrics", timeout=5).text
    assert "tierserve_ttft_seconds_bucket" in metrics


def test_local_file_path_image(client, png, expected, media_dir, tmp_path):
    """A path under --allowed-local-media-dir is read like the same bytes sent inline; others are refused."""
    import openai

    path = media_dir / "picture.png"
    path.write_bytes(png)
    local = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(path)}},
                                          {"type": "text", "text": PROMPT}]}]
    r = client.chat.completions.create(model="tiny-llava", messages=local, max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].message.content == expected[0]
    outside = tmp_path / "picture.png"
    outside.write_bytes(png)
    local[0]["content"][0]["image_url"]["url"] = f"file://{outside}"
    with pytest.raises(openai.BadRequestError, match="allowed"):
        client.chat.completions.create(model="tiny-llava", messages=local, max_tokens=MAX_TOKENS)
