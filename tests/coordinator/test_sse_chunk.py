"""A streamed chunk (coordinator/api/chat.py `_chunk`, built as a dict for speed) is exactly the JSON that
the ChatCompletionChunk model itself dumps, for every kind of chunk the stream sends."""

from __future__ import annotations

import json

import pytest

from coordinator.api.chat import Tracker, _chunk
from coordinator.api.schema import ChatCompletionChunk, ChoiceLogprobs, ChunkChoice, Delta, Usage

LOGPROBS = ChoiceLogprobs.model_validate({"content": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105],
                                                       "top_logprobs": [{"token": "hi", "logprob": -0.25,
                                                                         "bytes": [104, 105]}]}]})


def _model_json(rid: str, created: int, model: str, delta: Delta, finish=None, usage=None, choices=True,
                logprobs=None) -> dict:
    """What the pydantic model says the chunk is (None fields of the delta left out, as OpenAI does)."""
    body = ChatCompletionChunk(id=rid, created=created, model=model, usage=usage, choices=[ChunkChoice(
        delta=delta, finish_reason=finish, logprobs=logprobs)] if choices else []).model_dump(mode="json")
    for choice in body["choices"]:
        choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    return body


@pytest.mark.parametrize("kwargs", [
    {"delta": Delta(role="assistant", content="")},
    {"delta": Delta(content=" wörld \u2014 \"quoted\"\n")},
    {"delta": Delta(content="x"), "usage": Usage.of(7, 3)},
    {"delta": Delta(content="x"), "logprobs": LOGPROBS},
    {"delta": Delta(), "finish": "length"},
    {"delta": Delta(), "finish": "stop", "usage": Usage.of(7, 3)},
    {"delta": Delta(), "usage": Usage.of(7, 3), "choices": False},
])
def test_chunk_is_the_models_json(kwargs):
    tr = Tracker(None, "chatcmpl-1", 7, 0.0)  # type: ignore[arg-type]
    event = _chunk(tr, "tiny-llava", 1700000000, **kwargs)
    assert event.startswith("data: ") and event.endswith("\n\n")
    got = event[len("data: "):-2]
    want = _model_json("chatcmpl-1", 1700000000, "tiny-llava", **kwargs)
    assert json.loads(got) == want
    assert got == json.dumps(want, separators=(",", ":"))  # the same keys in the same order


def test_extra_fields_follow_the_chunk():
    tr = Tracker(None, "chatcmpl-1", 7, 0.0)  # type: ignore[arg-type]
    event = _chunk(tr, "m", 1, Delta(), usage=Usage.of(1, 2), choices=False, extra={"tierserve": {"e2e_s": 1.5}})
    assert json.loads(event[6:])["tierserve"] == {"e2e_s": 1.5}
