"""The chat-completions wire models, checked against the official `openai` client's own types."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion as OpenAIChatCompletion
from openai.types.chat import ChatCompletionChunk as OpenAIChatCompletionChunk
from openai.types.shared import ErrorObject
from pydantic import ValidationError

from coordinator.api.schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    ErrorResponse,
    ImageURLPart,
    InputAudioPart,
    ModelCard,
    ModelList,
    TextPart,
    TokenLogprob,
    TopLogprob,
    Usage,
    VideoPart,
    openai_finish_reason,
    param_from_loc,
)
from coordinator.errors import RequestError


def make_request(**overrides) -> dict:
    body = {"model": "tiny-llava", "messages": [{"role": "user", "content": "hi"}]}
    body.update(overrides)
    return body


def error_of(body: dict) -> ErrorResponse:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate(body)
    return ErrorResponse.from_validation_errors(exc.value.errors())


def make_completion() -> ChatCompletion:
    return ChatCompletion(
        id="chatcmpl-1",
        created=1700000000,
        model="tiny-llava",
        choices=[Choice(message=AssistantMessage(content="hello"), finish_reason="length")],
        usage=Usage.of(12, 3),
    )


def make_chunks() -> list[ChatCompletionChunk]:
    common = {"id": "chatcmpl-1", "created": 1700000000, "model": "tiny-llava"}
    return [
        ChatCompletionChunk(**common, choices=[ChunkChoice(delta=Delta(role="assistant", content=""))]),
        ChatCompletionChunk(**common, choices=[ChunkChoice(delta=Delta(content="hel"))]),
        ChatCompletionChunk(**common, choices=[ChunkChoice(delta=Delta(content="lo"))]),
        ChatCompletionChunk(**common, choices=[ChunkChoice(delta=Delta(), finish_reason="stop")]),
        ChatCompletionChunk(**common, choices=[], usage=Usage.of(12, 2)),
    ]


def mock_client(handler) -> openai.OpenAI:
    """The official client, talking to `handler` instead of a server."""
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return openai.OpenAI(api_key="x", base_url="http://t/v1", http_client=http)


# --- requests --------------------------------------------------------------------------------------


def test_parses_every_part_type_and_ignores_unknown_fields():
    req = ChatCompletionRequest.model_validate(
        make_request(
            messages=[
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "name": "alice",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                        {"type": "image_url", "image_url": "/data/cat.png"},
                        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                        {"type": "video", "video": ["a", "b"]},
                        {"type": "text", "text": "x", "prompt_cache_breakpoint": {"mode": "explicit"}},
                    ],
                },
                {"role": "assistant", "content": None},
            ],
            logprobs=True,
            top_logprobs=3,
            user="u1",
            tools=[{"type": "function"}],
            stream=True,
            stream_options={"include_usage": True},
            stop="\n",
            seed=7,
        )
    )
    parts = req.messages[1].content
    assert [type(p) for p in parts] == [TextPart, ImageURLPart, ImageURLPart, InputAudioPart, VideoPart, TextPart]
    assert parts[1].image_url.detail == "low"
    assert parts[2].image_url.url == "/data/cat.png"
    assert req.stream and req.stream_options.include_usage and req.stop == "\n" and req.seed == 7
    assert req.logprobs_k() == 3


@pytest.mark.parametrize("logprobs,top,k", [(True, None, 0), (True, 0, 0), (True, 20, 20), (False, None, None),
                                            (None, None, None)])
def test_logprobs_ask_for_k_alternatives(logprobs, top, k):
    assert ChatCompletionRequest.model_validate(make_request(logprobs=logprobs, top_logprobs=top)).logprobs_k() == k


@pytest.mark.parametrize("top", [21, -1])
def test_top_logprobs_beyond_what_is_served_is_refused(top):
    err = error_of(make_request(logprobs=True, top_logprobs=top)).error
    assert err.param == "top_logprobs"


@pytest.mark.parametrize("logprobs", [False, None])
def test_top_logprobs_without_logprobs_is_refused(logprobs):
    req = ChatCompletionRequest.model_validate(make_request(logprobs=logprobs, top_logprobs=2))
    with pytest.raises(RequestError) as exc:
        req.logprobs_k()
    assert exc.value.param == "top_logprobs" and "logprobs: true" in exc.value.message


def test_stream_options_continuous_usage_stats():
    req = ChatCompletionRequest.model_validate(make_request(stream=True, stream_options={
        "include_usage": False, "continuous_usage_stats": True}))
    assert req.stream_options.continuous_usage_stats and not req.stream_options.include_usage


def test_video_url_part_is_parsed_as_video():
    req = ChatCompletionRequest.model_validate(
        make_request(messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}])
    )
    assert isinstance(req.messages[0].content[0], VideoPart)


def test_unknown_role_names_the_field():
    err = error_of(make_request(messages=[{"role": "tool", "content": "x"}])).error
    assert err.param == "messages[0].role"
    assert "'system', 'developer', 'user' or 'assistant'" in err.message


def test_unknown_part_type_names_the_part():
    body = make_request(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "file"}]}])
    err = error_of(body).error
    assert err.param == "messages[0].content[1]"
    assert "content part 'type' must be one of 'text', 'image_url', 'input_audio'" in err.message


def test_image_part_without_url_names_the_url():
    body = make_request(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    err = error_of(body).error
    assert err.param == "messages[0].content[0].image_url.url"
    assert "Field required" in err.message


def test_content_of_wrong_type():
    err = error_of(make_request(messages=[{"role": "user", "content": 5}])).error
    assert err.param == "messages[0].content"
    assert err.message == "messages[0].content: content must be a string or a list of content parts"


def test_audio_format_is_checked():
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "flac"}}
    err = error_of(make_request(messages=[{"role": "user", "content": [part]}])).error
    assert err.param == "messages[0].content[0].input_audio.format"


@pytest.mark.parametrize("field,value", [("temperature", 2.5), ("temperature", -1), ("top_p", 1.5)])
def test_sampling_ranges(field, value):
    err = error_of(make_request(**{field: value})).error
    assert err.param == field


def test_model_is_required():
    body = make_request()
    del body["model"]
    assert error_of(body).error.param == "model"


def test_param_from_fastapi_loc():
    assert param_from_loc(("body", "messages", 2, "content", "<parts>", 0, "<image_url>", "image_url", "url")) == (
        "messages[2].content[0].image_url.url"
    )
    assert param_from_loc(("body",)) == ""
    assert ErrorResponse.from_validation_errors([]).error.message == "invalid request"


def test_what_the_openai_client_sends_parses():
    """Capture a real client's request body and parse it with our model."""
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=make_completion().model_dump())

    client = mock_client(handler)
    client.chat.completions.create(
        model="tiny-llava",
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
        ],
        max_completion_tokens=5,
        temperature=0,
        stop=["a", "b"],
        seed=1,
    )
    req = ChatCompletionRequest.model_validate(seen[0])
    assert req.max_completion_tokens == 5 and req.stop == ["a", "b"] and req.messages[0].role == "developer"


# --- responses -------------------------------------------------------------------------------------


def test_completion_parses_as_openai_type():
    parsed = OpenAIChatCompletion.model_validate(make_completion().model_dump())
    assert parsed.choices[0].message.content == "hello"
    assert parsed.choices[0].finish_reason == "length"
    assert parsed.usage.total_tokens == 15
    assert OpenAIChatCompletion.model_validate_json(make_completion().model_dump_json()).id == "chatcmpl-1"


def test_logprobs_parse_as_openai_types():
    lp = ChoiceLogprobs(content=[TokenLogprob(token=" a", logprob=-0.5, bytes=[32, 97], top_logprobs=[
        TopLogprob(token=" a", logprob=-0.5, bytes=[32, 97]), TopLogprob(token="b", logprob=-1.5, bytes=[98])])])
    completion = make_completion().model_copy(update={"choices": [
        Choice(message=AssistantMessage(content=" a"), finish_reason="length", logprobs=lp)]})
    parsed = OpenAIChatCompletion.model_validate(completion.model_dump()).choices[0].logprobs.content[0]
    assert (parsed.token, parsed.logprob, parsed.bytes) == (" a", -0.5, [32, 97])
    assert [(t.token, t.logprob) for t in parsed.top_logprobs] == [(" a", -0.5), ("b", -1.5)]
    chunk = make_chunks()[1].model_copy(update={"choices": [ChunkChoice(delta=Delta(content=" a"), logprobs=lp)]})
    assert OpenAIChatCompletionChunk.model_validate(chunk.model_dump()).choices[0].logprobs.content[0].logprob == -0.5


def test_chunks_parse_as_openai_type():
    parsed = [OpenAIChatCompletionChunk.model_validate(c.model_dump()) for c in make_chunks()]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parsed[:-1]) == "hello"
    assert parsed[3].choices[0].finish_reason == "stop"
    assert parsed[-1].choices == [] and parsed[-1].usage.completion_tokens == 2


def test_openai_client_reads_completion_stream_and_error():
    """End to end through the client's HTTP layer: JSON body, SSE stream, and a 400 error."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["model"] == "bad":
            err = ErrorResponse.from_error(RequestError("n=2 is not supported", "n"))
            return httpx.Response(400, json=err.model_dump())
        if body.get("stream"):
            sse = "".join(f"data: {c.model_dump_json()}\n\n" for c in make_chunks()) + "data: [DONE]\n\n"
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=make_completion().model_dump())

    client = mock_client(handler)
    msgs = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="m", messages=msgs).choices[0].message.content == "hello"
    opts = {"include_usage": True}
    stream = client.chat.completions.create(model="m", messages=msgs, stream=True, stream_options=opts)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello"
    assert chunks[-1].usage.total_tokens == 14
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="bad", messages=msgs, n=2)
    assert exc.value.param == "n" and "n=2 is not supported" in exc.value.message


def test_error_response_shape():
    body = ErrorResponse.from_error(RequestError("too long", "messages", code="context_length_exceeded")).model_dump()
    assert body == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert ErrorObject.model_validate(body["error"]).param == "messages"


def test_model_list_parses_as_openai_models():
    body = ModelList(data=[ModelCard(id="tiny-llava", created=1700000000)]).model_dump()
    assert body["object"] == "list"
    assert Model.model_validate(body["data"][0]).owned_by == "tierserve"


@pytest.mark.parametrize(
    "reason,expected", [(None, None), ("stop", "stop"), ("length", "length"), ("abort", "stop"), ("error", "stop")]
)
def test_finish_reason_mapping(reason, expected):
    assert openai_finish_reason(reason) == expected
