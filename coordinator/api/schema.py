"""Wire models of `POST /v1/chat/completions` and `GET /v1/models`, in OpenAI's format.

Requests are parsed leniently (unknown OpenAI fields are ignored, not rejected) so stock clients work;
the meaning of a request (image limits, token budgets) is checked later by `coordinator.prompt`.
Responses carry exactly the fields the official `openai` client parses.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from coordinator.errors import RequestError
from coordinator.protocol.logprobs import MAX_TOP_LOGPROBS
from coordinator.protocol.messages import FinishReason

# --- request ---------------------------------------------------------------------------------------

class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str
    """A data URL (`data:image/png;base64,...`), an absolute local path, or a `file://` URL."""
    detail: str | None = None
    """OpenAI's resolution hint; accepted and ignored (the processor fixes the resolution)."""


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_url(cls, v: Any) -> Any:
        """Some clients send `"image_url": "<url>"`; treat it as `{"url": ...}`."""
        return {"url": v} if isinstance(v, str) else v


class InputAudio(BaseModel):
    data: str
    """Base64 audio bytes."""
    format: Literal["wav", "mp3"]


class InputAudioPart(BaseModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class VideoURL(BaseModel):
    url: str
    """An animated GIF/WebP as a data URL or an allowed local path (see coordinator/video.py)."""


class VideoPart(BaseModel):
    """A video, in either of the two formats servers accept:

    - `{"type": "video", "video": ["<frame image URL>", ...]}`: frames the client sampled (Qwen's format);
    - `{"type": "video_url", "video_url": {"url": "..."}}`: vLLM's format, here an animated GIF or WebP.
    Whether the model takes video at all is checked later (coordinator.prompt).
    """

    type: Literal["video", "video_url"]
    video: list[str] | None = None
    video_url: VideoURL | None = None

    @field_validator("video_url", mode="before")
    @classmethod
    def _bare_url(cls, v: Any) -> Any:
        return {"url": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_source(self) -> "VideoPart":
        if self.type == "video" and self.video is None:
            raise ValueError('a "video" part needs "video": a list of frame image URLs')
        if self.type == "video_url" and self.video_url is None:
            raise ValueError('a "video_url" part needs "video_url": {"url": ...}')
        return self


def _part_tag(v: Any) -> str | None:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    t = "video" if t == "video_url" else t
    return f"<{t}>" if t in ("text", "image_url", "input_audio", "video") else None


# Tags are wrapped in <> so `param_from_loc` can tell them from field names.
ContentPart = Annotated[
    Union[
        Annotated[TextPart, Tag("<text>")],
        Annotated[ImageURLPart, Tag("<image_url>")],
        Annotated[InputAudioPart, Tag("<input_audio>")],
        Annotated[VideoPart, Tag("<video>")],
    ],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_content_part",
        custom_error_message="content part 'type' must be one of 'text', 'image_url', 'input_audio', 'video', "
                             "'video_url'",
    ),
]


def _content_tag(v: Any) -> str | None:
    return "<string>" if isinstance(v, str) else "<parts>" if isinstance(v, (list, tuple)) else None


Content = Annotated[
    Union[Annotated[str, Tag("<string>")], Annotated[list[ContentPart], Tag("<parts>")]],
    Discriminator(
        _content_tag,
        custom_error_type="invalid_content",
        custom_error_message="content must be a string or a list of content parts",
    ),
]


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    """`developer` is OpenAI's newer name for `system` and is rendered as one."""
    content: Content | None = None
    """None only makes sense for an assistant turn (rendered as empty text)."""


class StreamOptions(BaseModel):
    include_usage: bool = False
    """Send one last chunk with empty `choices` and the request's token usage."""
    continuous_usage_stats: bool = False
    """vLLM's extension: every chunk carries `usage` so far (completion tokens up to it), whether or not
    include_usage asks for the last usage chunk too."""


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's request we honour; other OpenAI fields (user, tools...) are ignored.

    Every model here keeps pydantic's default extra="ignore", so new OpenAI fields never break parsing.
    """

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    """Most tokens to generate; without it (and max_completion_tokens) the model generates until it stops
    or the context is full, as OpenAI and vLLM do."""
    max_completion_tokens: int | None = None
    """OpenAI's newer name for max_tokens; wins when both are given."""
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    """vLLM's extension: keep generating past the end-of-sequence token until max_tokens (benchmarks
    use it to fix output lengths)."""
    logprobs: bool | None = False
    """Return each generated token's log-probability (`choices[].logprobs.content`)."""
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """With logprobs: also this many most likely tokens at each position (0 to 20)."""

    def logprobs_k(self) -> int | None:
        """SamplingParams.logprobs of this request: None without logprobs, else the alternatives asked for."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return self.top_logprobs or 0


# --- responses -------------------------------------------------------------------------------------

OpenAIFinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


def openai_finish_reason(reason: FinishReason | None) -> OpenAIFinishReason | None:
    """Map the engine's reasons onto OpenAI's: strict clients reject anything outside their Literal.

    `abort` and `error` become `stop`; an error should also be reported as an error, not only a reason.
    """
    return None if reason is None else "length" if reason == "length" else "stop"


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class TopLogprob(BaseModel):
    token: str
    """The token's text as the tokenizer decodes it alone (vLLM's choice; a byte of a split character is U+FFFD)."""
    logprob: float
    bytes: list[int] | None = None
    """UTF-8 bytes of `token`."""


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []
    """The top_logprobs most likely tokens at this position, most likely first."""


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    """One entry per generated token, in order."""


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: OpenAIFinishReason
    logprobs: ChoiceLogprobs | None = None
    """Only when the request set logprobs."""


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    """Unix seconds."""
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class Delta(BaseModel):
    """A chunk's increment; fields that are None are left out of the chunk, as OpenAI does."""

    role: Literal["assistant"] | None = None
    """Set on the first chunk only."""
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: OpenAIFinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    """The logprobs of the tokens this chunk carries, when the request set logprobs."""


class ChatCompletionChunk(BaseModel):
    id: str
    """The same id on every chunk of one completion."""
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    """Empty on the final usage chunk (stream_options.include_usage)."""
    usage: Usage | None = None
    """On the final usage chunk; on every chunk with stream_options.continuous_usage_stats."""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tierserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- errors ----------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail

    @classmethod
    def from_error(cls, err: RequestError) -> ErrorResponse:
        return cls(error=ErrorDetail(message=err.message, type=err.type, param=err.param, code=err.code))

    @classmethod
    def from_validation_errors(cls, errors: Sequence[dict[str, Any]]) -> ErrorResponse:
        """From pydantic's or FastAPI's `exc.errors()`: the first error, its location as `param`."""
        if not errors:
            return cls(error=ErrorDetail(message="invalid request"))
        first = errors[0]
        param = param_from_loc(first.get("loc", ()))
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid value")
        return cls(error=ErrorDetail(message=message, param=param or None))


_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def param_from_loc(loc: Sequence[str | int]) -> str:
    """`("body", "messages", 0, "content", "<parts>", 1, "type")` -> `messages[0].content[1].type`.

    Drops FastAPI's leading "body" and pydantic's union tags and wrapper names, which are not fields.
    """
    out = ""
    for i, item in enumerate(loc):
        if isinstance(item, int):
            out += f"[{item}]"
        elif _FIELD.match(item) and not (i == 0 and item == "body"):
            out += f".{item}" if out else item
    return out
