"""A cluster whose only LLM worker runs `--engine null` serves chat requests end to end through the real
coordinator (the serving path benchmarks/coordinator_capacity.py measures), JSON and SSE alike."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoProcessor

from cluster_factory import serve_cluster
from coordinator.protocol.models import DEFAULT_MODEL_DIR

pytestmark = [pytest.mark.redis]
PROMPT = "tell me about the quick brown fox"


@pytest.fixture(scope="module")
def null_cluster(redis_url, tmp_path_factory):
    yield from serve_cluster(tmp_path_factory.mktemp("null-logs"), encode_workers=0, llm_roles=["combined"],
                             redis_url=redis_url, llm_args=["--engine", "null"])


def _body(**extra) -> dict:
    return {"model": "tiny-llava", "max_tokens": 5, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}], **extra}


def test_a_null_worker_answers_through_the_coordinator(null_cluster):
    r = httpx.post(f"{null_cluster.url}/v1/chat/completions", json=_body(), timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
    assert body["tierserve"]["prefill_worker"] == "llm-0-combined"
    # The text is real text of the model's tokenizer: the prompt's own ordinary tokens, cycled.
    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)
    ids = processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                                        add_generation_prompt=True, tokenize=True)
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    cycle = processor.tokenizer.decode(ids, skip_special_tokens=True)
    content = choice["message"]["content"]
    assert content.strip() and content in cycle * 3

    again = httpx.post(f"{null_cluster.url}/v1/chat/completions", json=_body(), timeout=30).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]  # deterministic


def test_streaming_and_refused_logprobs(null_cluster):
    with httpx.stream("POST", f"{null_cluster.url}/v1/chat/completions", json=_body(stream=True), timeout=30) as r:
        assert r.status_code == 200
        lines = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(c) for c in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).strip()
    # The null engine has no distribution: a logprobs request fails with the engine's reason, not silently.
    r = httpx.post(f"{null_cluster.url}/v1/chat/completions", json=_body(logprobs=True), timeout=30)
    assert r.status_code == 500 and "no model distribution" in r.json()["error"]["message"]
