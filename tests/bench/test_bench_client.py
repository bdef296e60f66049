"""The streaming client against scripted servers (httpx.MockTransport): timings, usage, and every
failure becoming an error type on the record instead of an exception."""

from __future__ import annotations

import asyncio
import json

import httpx

from benchmarks.bench.client import ClientOptions, RequestRecord, send
from benchmarks.bench.workload import RequestSpec

SPEC = RequestSpec(index=0, content=[{"type": "text", "text": "hi"}], max_tokens=3, meta={"modality": "text"})


def sse(*chunks: dict | str) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


def chunk(content: str | None = None, role: str | None = None) -> dict:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}


def run(handler, opts: ClientOptions | None = None) -> tuple[RequestRecord, list[dict]]:
    seen: list[dict] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return handler(request)

    async def go() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(recording), base_url="http://x") as c:
            return await send(c, SPEC, opts or ClientOptions(model="m"), RequestRecord(index=0, scheduled_s=0.0), 0.0)

    return asyncio.run(go()), seen


def stream(body: bytes, status: int = 200, ctype: str = "text/event-stream"):
    return lambda req: httpx.Response(status, content=body, headers={"content-type": ctype})


def test_a_normal_stream():
    body = sse(chunk("", role="assistant"), chunk("a"), chunk("b"), chunk("c"),
               {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}, "[DONE]")
    rec, seen = run(stream(body))
    assert rec.ok and rec.error_type is None
    assert (rec.output_tokens, rec.prompt_tokens, len(rec.itl_s)) == (3, 9, 2)  # the role chunk is no token
    assert rec.ttft_s <= rec.e2e_s and rec.tpot_s is not None
    assert rec.request == {"modality": "text", "max_tokens": 3}
    assert seen[0]["stream"] and seen[0]["ignore_eos"] and seen[0]["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in run(stream(body), ClientOptions(model="m", ignore_eos=False))[1][0]


def test_no_usage_counts_content_chunks():
    rec, _ = run(stream(sse(chunk("a"), chunk("b"), "[DONE]")))
    assert rec.ok and rec.output_tokens == 2


def test_failures_become_error_types():
    cases = {
        "http_400": stream(json.dumps({"error": {"message": "bad image"}}).encode(), 400, "application/json"),
        "http_503": stream(b"busy", 503, "text/plain"),
        "bad_response": stream(json.dumps({"choices": []}).encode(), 200, "application/json"),
        "stream_error": stream(sse(chunk("a"), {"error": {"message": "worker died", "type": "server_error"}})),
        "no_tokens": stream(sse(chunk("", role="assistant"), "[DONE]")),
    }
    for expected, handler in cases.items():
        rec, _ = run(handler)
        assert (rec.ok, rec.error_type) == (False, expected), rec
    assert run(cases["http_400"])[0].error == "bad image"
    assert "worker died" in run(cases["stream_error"])[0].error
    rec, _ = run(stream(b"data: <html>\n\n"))
    assert rec.error_type == "bad_response" and "not JSON" in rec.error
    rec, _ = run(stream(sse({"id": 1})))
    assert rec.error_type == "bad_response" and "choices" in rec.error


def test_transport_errors_do_not_escape():
    def refuse(req):
        raise httpx.ConnectError("refused", request=req)

    def slow(req):
        raise httpx.ReadTimeout("slow", request=req)

    def weird(req):
        raise RuntimeError("boom")

    assert run(refuse)[0].error_type == "connect_error"
    assert run(slow)[0].error_type == "timeout"
    assert run(weird)[0].error_type == "client_error:RuntimeError"
