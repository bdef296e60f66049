"""Admission control: at most `limit` chat completions in flight; the next one is answered 429 at once.

A pure ASGI middleware rather than a dependency, because a slot must be held until the response is
completely sent: a streaming (SSE) answer keeps its slot until its last chunk or until the client leaves,
and only the ASGI call around the whole response sees that moment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

ADMITTED_PATHS = frozenset({"/v1/chat/completions"})
"""The requests that cost compute and a Redis connection for their whole life; /health, /metrics and the
admin API stay answerable under full load."""


@dataclass
class AdmissionStats:
    """What the middleware has done so far (read by tests and, through the app, by anyone curious)."""

    in_flight: int = 0
    admitted: int = 0
    rejected: int = 0


def rate_limit_body(limit: int, retry_after_s: int) -> dict:
    """OpenAI's 429 shape; its clients raise `RateLimitError` on the status and honour Retry-After."""
    return {"error": {
        "message": f"the coordinator is at its limit of {limit} requests in flight; retry after "
                   f"{retry_after_s} s, or raise the limit with --max-in-flight",
        "type": "requests", "param": None, "code": "rate_limit_exceeded"}}


class Admission:
    """Counts admitted requests from arrival until their response is sent, and refuses the one over `limit`.

    No lock is needed: the count is checked and changed without an await in between, on the one event loop.
    """

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int = 1, stats: AdmissionStats | None = None,
                 counts: Callable[[Scope], bool] = lambda scope: True):
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.app, self.limit, self.retry_after_s = app, limit, retry_after_s
        self.stats = stats or AdmissionStats()
        """Handed in by the app factory, which builds the middleware lazily and keeps no other handle."""
        self.counts = counts
        """Whether a request takes a slot: one without a valid API key does not (the route answers it 401)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ADMITTED_PATHS
                or not self.counts(scope)):
            await self.app(scope, receive, send)
            return
        if self.stats.in_flight >= self.limit:
            self.stats.rejected += 1
            await self._refuse(send)
            return
        self.stats.in_flight += 1
        self.stats.admitted += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.stats.in_flight -= 1

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(rate_limit_body(self.limit, self.retry_after_s)).encode()
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode())]})
        await send({"type": "http.response.body", "body": body})
