"""OpenAI conformance of the live coordinator beyond logprobs, as aiperf and guidellm exercise it: generation to
the context's end without max_tokens, usage on every chunk, chunks without `"role": null`, HEAD on /metrics and
/health, and OpenAI's retrieve-model route."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]

MODEL = "tiny-llava"
MAX_TOKENS = 6


def _messages(text: str = "Name three colours.") -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client(cluster):
    from openai import OpenAI

    return OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_without_max_tokens_it_generates_to_the_contexts_end(client, tiny_model):
    """No max_tokens: the completion runs to the end of the 2048-token context (eos ignored, so exactly there)."""
    tokenizer, context = tiny_model[1].tokenizer, tiny_model[0].config.text_config.max_position_embeddings
    text = "a " * (context - 40)  # about context - 30 tokens once templated
    r = client.chat.completions.create(model=MODEL, messages=_messages(text), temperature=0,
                                       extra_body={"ignore_eos": True})
    assert 0 < context - r.usage.prompt_tokens < 60 and len(tokenizer(text)["input_ids"]) < context
    assert r.usage.completion_tokens == context - r.usage.prompt_tokens
    assert r.choices[0].finish_reason == "length"


def _sse(cluster, **fields) -> list[dict]:
    body = {"model": MODEL, "messages": _messages(), "max_tokens": MAX_TOKENS, "stream": True, **fields}
    with httpx.stream("POST", f"{cluster.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_only_the_first_chunk_has_a_role(cluster, client):
    chunks = _sse(cluster)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] is not None
    assert all(v is not None for c in chunks for v in c["choices"][0]["delta"].values())
    parsed = list(client.chat.completions.create(model=MODEL, messages=_messages(), max_tokens=3, stream=True))
    assert parsed[0].choices[0].delta.role == "assistant" and all(c.choices[0].delta.role is None for c in parsed[1:])


@pytest.mark.parametrize("include_usage", [False, True])
def test_continuous_usage_stats_puts_usage_on_every_chunk(cluster, include_usage):
    chunks = _sse(cluster, stream_options={"continuous_usage_stats": True, "include_usage": include_usage},
                  ignore_eos=True)
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    done = [u["completion_tokens"] for u in usages]
    assert done == sorted(done) and done[0] == 0 and done[-1] == MAX_TOKENS
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    assert (chunks[-1]["choices"] == []) == include_usage  # the final usage-only chunk only with include_usage


def test_include_usage_alone_gives_one_usage_chunk(cluster):
    chunks = _sse(cluster, stream_options={"include_usage": True}, ignore_eos=True)
    assert [c["usage"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS


def test_head_metrics_is_200_without_a_body(cluster):
    r = httpx.head(f"{cluster.url}/metrics", timeout=5)
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"].startswith("text/plain")


def test_head_health_has_the_status_of_get(cluster):
    r = httpx.head(f"{cluster.url}/health", timeout=5)
    assert r.status_code == 200 and r.content == b""


def test_retrieve_model(client):
    import openai

    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")
