"""What the OpenAPI document says each route answers, so clients and the schema fuzzer can hold it to that.

The chat route parses its own body (to refuse an oversized one before it is in memory) and returns
JSONResponse or StreamingResponse, so FastAPI can infer neither its request nor its responses: both are
declared here, the responses through `include_router(..., responses=...)` and the request body and the
stream's chunk schema by `describe_chat`, which the app installs as its `openapi()`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from coordinator.api.schema import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ErrorResponse


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


REDIS_DOWN = {503: _error("Redis unreachable or every connection busy; retry after the Retry-After header")}
API_KEY = {401: _error("no API key, or not one of the coordinator's (only when it has keys)")}

SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"anyOf": [
    {"const": "[DONE]"},
    {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
        {"$ref": "#/components/schemas/ChatCompletionChunk"}, {"$ref": "#/components/schemas/ErrorResponse"}]}},
]}}}
"""One server-sent event of a streamed completion (Open API 3.1: `schema` describes each event): a chunk, an
error that ends the stream, or the closing `[DONE]`."""

CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ChatCompletion, "description": "the completion; with `stream: true`, server-sent "
          "`chat.completion.chunk` events ending in `data: [DONE]`",
          "content": {"text/event-stream": {"schema": SSE_EVENT}}},
    400: _error("the request is malformed or asks for something this model cannot do"),
    **API_KEY,
    404: _error("the `model` is not the one served here"),
    413: _error("the body is larger than any valid request (see --max-image-bytes)"),
    429: _error("the coordinator is at --max-in-flight; retry after the Retry-After header"),
    499: _error("the client went away before the answer (never seen by that client)"),
    500: _error("a worker failed the request"),
    503: _error("no worker that can serve it is alive, or Redis is unreachable (Retry-After)"),
    504: _error("no final token within --request-timeout; the request was aborted"),
}
MODELS_RESPONSES = {**API_KEY, **REDIS_DOWN}
CLUSTER_RESPONSES = {**API_KEY, **REDIS_DOWN}
ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("a knob is unknown or out of range"),
    401: _error("the admin token is missing or wrong (when the coordinator has one)"),
    403: _error("no admin token is set and the request was not addressed to a loopback name"),
    **REDIS_DOWN,
}
HEALTH_RESPONSES = {503: {"description": "Redis unreachable: `{\"status\": \"unhealthy\", \"redis\": ...}`"}}


def declare_limits(request: dict[str, Any]) -> dict[str, Any]:
    """The request limits coordinator.prompt enforces (with its own messages) that the pydantic model does not
    carry, so the document tells clients and the fuzzer what a 400 will be for."""
    props = request["properties"]
    props["messages"]["minItems"] = 1
    for field in ("max_tokens", "max_completion_tokens"):
        props[field]["anyOf"][0]["minimum"] = 1
    props["n"]["anyOf"][0].update(minimum=1, maximum=1)
    props["stop"]["anyOf"][0]["minLength"] = 1
    props["stop"]["anyOf"][1]["items"]["minLength"] = 1
    return request


def describe_chat(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with the chat route's request body, built once and cached on the app."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    request = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request.pop("$defs", {}))
    chunk = ChatCompletionChunk.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
    components.update(chunk.pop("$defs", {}))
    components["ChatCompletionChunk"] = chunk
    components["ChatCompletionRequest"] = declare_limits(request)
    schema["paths"]["/v1/chat/completions"]["post"]["requestBody"] = {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}}
    app.openapi_schema = schema
    return schema
