"""What the planner sends to a live cluster (profiling, trial replay) and what it reads back.

`tierserve profile` and the live trial backend reach a cluster only through its public API
(POST /v1/chat/completions, GET /v1/models and /v1/cluster, /v1/admin/policy): coordinator/ may not
import the workers (DESIGN, dependency direction), and the API is all a remote deployment exposes.

Requests are sized in tokens. `PromptSizer` learns from three probe requests how many prompt tokens
the chat template, one filler word and one image make, so a prompt of N tokens can be asked for
without loading the model's tokenizer here; `ignore_eos` fixes output lengths. Non-streaming
answers carry the coordinator's `tierserve` record (compute timings, a wall-clock mark per hop),
which profiling reads; `Answer.marks` rebuilds the marks as seconds since the request was received.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import httpx
from pydantic import BaseModel, ConfigDict, Field

CHAT_PATH = "/v1/chat/completions"
POLICY_PATH = "/v1/admin/policy"
FILLER_WORD = " the"
"""Padding text: one token per repetition in most tokenizers (PromptSizer measures it anyway)."""


class LiveClusterError(RuntimeError):
    """A request to a live cluster failed; the message says which and what to do."""


@lru_cache(maxsize=8)
def _image_url(i: int) -> str:
    from coordinator.demo import data_url, demo_image

    return data_url(demo_image(i))


def chat_body(model: str, words: int, images: int, max_tokens: int, stream: bool = False) -> dict:
    """A greedy chat request: `images` small pictures, `words` filler words, exactly `max_tokens` out."""
    content: list[dict] = [{"type": "image_url", "image_url": {"url": _image_url(i % 6)}} for i in range(images)]
    if words > 0:
        content.append({"type": "text", "text": FILLER_WORD * words})
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


async def get_json(client: httpx.AsyncClient, path: str) -> dict:
    try:
        r = await client.get(path)
    except httpx.HTTPError as exc:
        raise LiveClusterError(f"cannot reach the coordinator at {client.base_url}{path}: {exc!r}; is the cluster "
                               f"up (`tierserve up`) and the URL right?") from None
    if r.status_code != 200:
        hint = " (pass the coordinator's --admin-token)" if r.status_code == 401 else ""
        raise LiveClusterError(f"GET {path} answered {r.status_code}: {error_message(r)}{hint}")
    return r.json()


async def put_policy(client: httpx.AsyncClient, policy: dict) -> dict:
    """PUT /v1/admin/policy (sections given in full replace the current ones); returns what now runs."""
    try:
        r = await client.put(POLICY_PATH, json=policy)
    except httpx.HTTPError as exc:
        raise LiveClusterError(f"cannot reach {client.base_url}{POLICY_PATH}: {exc!r}") from None
    if r.status_code != 200:
        hint = " (pass the coordinator's --admin-token)" if r.status_code == 401 else ""
        raise LiveClusterError(f"PUT {POLICY_PATH} answered {r.status_code}: {error_message(r)}{hint}")
    return r.json()


async def served_model(client: httpx.AsyncClient) -> str:
    """The model name the cluster serves (GET /v1/models)."""
    data = (await get_json(client, "/v1/models")).get("data") or []
    if not data:
        raise LiveClusterError(f"{client.base_url}/v1/models lists no model; is this a tierserve coordinator?")
    return str(data[0]["id"])


@dataclass(frozen=True)
class Answer:
    """One non-streaming answer and the coordinator's `tierserve` record of it."""

    prompt_tokens: int
    """usage.prompt_tokens: text, template and media placeholders."""
    completion_tokens: int
    """usage.completion_tokens."""
    client_s: float
    """Send to full response, at the client."""
    compute: dict
    """Worker compute seconds: encode_s (the whole batch's encoder call), encode_batch, prefill_s and
    decode_s (sums of the engine steps it was in), transfer_s."""
    marks: dict[str, float]
    """Each hop's mark (received, submitted, encode_dequeued, encode_start, encode_end, embeddings_sent,
    admitted, first_token, finished, relayed) as seconds since `received`."""

    def span(self, start: str, end: str) -> float:
        """Seconds from mark `start` to mark `end`; KeyError names a missing mark."""
        return self.marks[end] - self.marks[start]


def mark_offsets(stages: dict[str, float]) -> dict[str, float]:
    """Marks from the record's `stages_s` ({"a->b": seconds}, in the order the request passed them)."""
    out: dict[str, float] = {}
    t = 0.0
    for hop, seconds in stages.items():
        start, _, end = hop.partition("->")
        out.setdefault(start, t)
        t += seconds
        out[end] = t
    return out


async def ask(client: httpx.AsyncClient, body: dict) -> Answer:
    """POST one non-streaming request; LiveClusterError unless it was answered in full."""
    start = time.perf_counter()
    try:
        r = await client.post(CHAT_PATH, json=body)
    except httpx.HTTPError as exc:
        raise LiveClusterError(f"POST {CHAT_PATH} to {client.base_url} failed: {exc!r}") from None
    elapsed = time.perf_counter() - start
    if r.status_code != 200:
        raise LiveClusterError(f"POST {CHAT_PATH} answered {r.status_code}: {error_message(r)}")
    doc = r.json()
    record = doc.get("tierserve") or {}
    if not record.get("compute") or not record.get("stages_s"):
        raise LiveClusterError(f"the answer from {client.base_url} has no `tierserve` timings record; profiling "
                               f"needs a tierserve coordinator")
    usage = doc["usage"]
    return Answer(usage["prompt_tokens"], usage["completion_tokens"], elapsed, record["compute"],
                  mark_offsets(record["stages_s"]))


class PromptSizer(BaseModel):
    """Prompt tokens as a function of filler words and images, learnt from probe requests."""

    model_config = ConfigDict(frozen=True)

    base_tokens: float
    """Prompt tokens of a request with no text and no media (the chat template), extrapolated."""
    tokens_per_word: float = Field(gt=0)
    """Prompt tokens one FILLER_WORD adds."""
    tokens_per_image: int = Field(ge=0)
    """Placeholder tokens one image adds (fixed for LLaVA-style encoders)."""

    def tokens(self, words: int, images: int) -> int:
        return round(self.base_tokens + self.tokens_per_word * words + self.tokens_per_image * images)

    def words_for(self, prompt_tokens: int, images: int) -> int:
        """Filler words giving `prompt_tokens` in all (fewer when the template and images already exceed
        it: the caller compares `tokens` with what it wanted). Text-only prompts keep one word."""
        words = round((prompt_tokens - self.base_tokens - self.tokens_per_image * images) / self.tokens_per_word)
        return max(words, 0 if images else 1)

    @classmethod
    async def calibrate(cls, client: httpx.AsyncClient, model: str, images: bool = True) -> PromptSizer:
        """Three one-token probes: 1 and 33 words of text, then 1 word with one image (skipped when
        `images` is False, e.g. for a text-only model)."""
        short = await ask(client, chat_body(model, 1, 0, 1))
        long = await ask(client, chat_body(model, 33, 0, 1))
        per_word = (long.prompt_tokens - short.prompt_tokens) / 32
        if per_word <= 0:
            raise LiveClusterError(f"filler words add no prompt tokens ({short.prompt_tokens} and "
                                   f"{long.prompt_tokens} tokens for 1 and 33 words); cannot size prompts")
        per_image = 0
        if images:
            per_image = (await ask(client, chat_body(model, 1, 1, 1))).prompt_tokens - short.prompt_tokens
        return cls(base_tokens=short.prompt_tokens - per_word, tokens_per_word=per_word, tokens_per_image=per_image)
