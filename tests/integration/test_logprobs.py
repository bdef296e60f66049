"""logprobs/top_logprobs through the live coordinator, checked against the model's own logits; what cannot be
served is a 400."""

from __future__ import annotations

import httpx
import pytest
import torch

pytestmark = [pytest.mark.redis, pytest.mark.slow]

MODEL = "tiny-llava"
PROMPT = "Name three colours."
MAX_TOKENS = 6
TOP = 5


def _messages(text: str = PROMPT) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """generate()'s greedy tokens and each step's log_softmax (float32) for PROMPT, eos ignored."""
    model, processor = tiny_model
    prompt = processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                                           add_generation_prompt=True)
    inputs = processor(text=prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, [torch.log_softmax(step[0].float(), -1) for step in out.logits], processor.tokenizer


@pytest.fixture(scope="module")
def client(cluster):
    from openai import OpenAI

    return OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _check_against_reference(content, reference) -> None:
    tokens, logprobs, tokenizer = reference
    assert len(content) == len(tokens)
    for step, (entry, token, lp) in enumerate(zip(content, tokens, logprobs)):
        text = tokenizer.decode([token])
        assert (entry.token, entry.bytes) == (text, list(text.encode("utf-8", errors="replace"))), step
        assert abs(entry.logprob - lp[token].item()) < 1e-5, step
        top = lp.topk(TOP)
        assert [t.token for t in entry.top_logprobs] == [tokenizer.decode([i]) for i in top.indices.tolist()], step
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top.values.tolist())) < 1e-5, step


def test_logprobs_match_the_models_own(client, reference):
    """Non-streamed and streamed (official client): each token's logprob and its top 5 are log_softmax of the
    weights' own logits within 1e-5, through whichever LLM path the cluster picks."""
    kw = dict(model=MODEL, messages=_messages(), max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
              top_logprobs=TOP, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    _check_against_reference(r.choices[0].logprobs.content, reference)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    _check_against_reference(streamed, reference)


def test_no_logprobs_unless_asked(client):
    r = client.chat.completions.create(model=MODEL, messages=_messages(), max_tokens=2)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model=MODEL, messages=_messages(), max_tokens=2, logprobs=True)
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in r.choices[0].logprobs.content)


@pytest.mark.parametrize("fields,reason", [({"logprobs": True, "top_logprobs": 21}, "less than or equal to 20"),
                                           ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
                                           ({"logprobs": False, "top_logprobs": 0}, "needs logprobs")])
def test_logprobs_it_cannot_serve_are_a_400(cluster, fields, reason):
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": _messages(), "max_tokens": 2, **fields})
    assert r.status_code == 400 and reason in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "top_logprobs"
