"""The one exception a request can fail validation with; the API layer turns it into OpenAI's error shape."""

from __future__ import annotations


class RequestError(Exception):
    """A client mistake: `message` says what to change, `param` names the offending request field.

    `param` uses the request's own spelling (`messages[1].content[0].image_url.url`) so a client can
    find the field; `status` is the HTTP status the API answers with.
    """

    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r}, status={self.status})"


class MediaError(RequestError):
    """A media part the coordinator will not accept; the message says what to send instead."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, status=400)
