"""Who may call what: API keys on /v1/*, the admin token on /v1/admin/*, and which addresses may go unguarded.

The checks are FastAPI dependencies that raise HTTPException with OpenAI's error body as `detail`; the
app's HTTPException handler sends that body as it is, with the exception's headers (WWW-Authenticate).
Keys are compared as bytes in constant time: Starlette decodes header values as latin-1, which never fails,
so encoding them back gives exactly the bytes the client sent, ASCII or not.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from fastapi import Depends, HTTPException, Request

from coordinator.protocol import envs
from coordinator.protocol.addresses import is_loopback
from coordinator.state import State


def bind_refusal(host: str, admin_token: str | None) -> str | None:
    """Why the coordinator must not listen on `host`, or None when it may: the admin API changes the
    cluster's policy, so off loopback it needs a token."""
    if admin_token is not None or is_loopback(host):
        return None
    return (f"refusing to listen on {host}: that address is reachable from other machines, and the admin API "
            "(/v1/admin/*) has no token. Set one in the environment (TIERSERVE_ADMIN_TOKEN=...), in a file "
            "(--admin-token-file PATH or TIERSERVE_ADMIN_TOKEN_FILE=PATH), or listen on 127.0.0.1. Add "
            "--api-key-file PATH (or TIERSERVE_API_KEYS) to guard /v1 too.")


class SecretError(ValueError):
    """A key or token that cannot be loaded or used; the message never contains the secret."""


def load_secrets(key_flags: list[str], key_file: Path | None, token_flag: str | None,
                 token_file: Path | None) -> tuple[tuple[str, ...], str | None]:
    """(API keys, admin token) from flags, files and the environment (coordinator.protocol.envs).

    API keys: the union of every source, in order, without repeats. Admin token: --admin-token, else
    --admin-token-file, else TIERSERVE_ADMIN_TOKEN(_FILE)."""
    try:
        keys = [*key_flags, *(envs.key_lines(key_file) if key_file else []), *envs.api_keys()]
        token = token_flag or (token_file.read_text().strip() if token_file else None) or envs.admin_token()
    except OSError as e:
        raise SecretError(f"cannot read a key or token file: {e}") from None
    problem = secret_problem("API key", keys) or secret_problem("admin token", [token] if token is not None else [])
    if problem:
        raise SecretError(problem)
    return tuple(dict.fromkeys(keys)), token


def secret_problem(what: str, secrets: list[str]) -> str | None:
    """Why a configured secret cannot work, without printing it: one a client cannot put in an HTTP header
    would lock everyone out."""
    for i, secret in enumerate(secrets, 1):
        if not secret or not secret.isascii() or not secret.isprintable() or " " in secret:
            return (f"{what} number {i} is empty or not printable ASCII without spaces; it travels in an HTTP "
                    "header, so fix the flag, file or environment variable that set it")
    return None


def host_without_port(header: str) -> str:
    """`127.0.0.1:8000` -> `127.0.0.1`, `[::1]:8000` -> `[::1]`, `localhost` -> `localhost`."""
    if header.startswith("["):
        return header[:header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def bearer(request: Request) -> bytes | None:
    """The credential after `Bearer ` in the Authorization header as the bytes sent; None if there is none."""
    return bearer_of(request.headers.get("authorization"))


def bearer_of(value: str | None) -> bytes | None:
    """`bearer` of an Authorization header's value."""
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip().encode("latin-1") or None


def has_api_key(scope: dict, keys: tuple[str, ...]) -> bool:
    """Whether an ASGI request carries one of `keys` (True when none are configured): admission counts only
    such requests, so a caller without a valid key gets its 401 at any load, never a 429, and holds no slot."""
    if not keys:
        return True
    value = next((v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"), None)
    given = bearer_of(value.decode("latin-1")) if value is not None else None
    return given is not None and matches(given, keys)


def matches(given: bytes, accepted: tuple[str, ...]) -> bool:
    """Constant time in the given key: every accepted key is compared, none is skipped on a match."""
    found = False
    for key in accepted:
        found |= hmac.compare_digest(given, key.encode())
    return found


def masked(given: bytes) -> str:
    """Enough of a wrong key for its owner to recognize it, as OpenAI shows it; short keys not at all."""
    text = given.decode("latin-1")
    return f"{text[:3]}{'*' * 8}{text[-4:]}" if len(text) >= 12 else "*" * 8


def _unauthorized(message: str, code: str | None) -> HTTPException:
    return HTTPException(401, headers={"WWW-Authenticate": "Bearer"}, detail={"error": {
        "message": message, "type": "invalid_request_error", "param": None, "code": code}})


async def require_api_key(request: Request, state: State) -> None:
    """Passes when no keys are configured (an open loopback cluster) or the bearer token is one of them."""
    keys = state.config.api_keys
    if not keys:
        return
    given = bearer(request)
    if given is None:
        raise _unauthorized("You didn't provide an API key. Provide it in an Authorization header using Bearer "
                            "auth (Authorization: Bearer YOUR_KEY); the server's keys are set with --api-key, "
                            "--api-key-file or TIERSERVE_API_KEYS.", None)
    if not matches(given, keys):
        raise _unauthorized(f"Incorrect API key provided: {masked(given)}. Use one of the keys the coordinator "
                            "was started with (--api-key, --api-key-file or TIERSERVE_API_KEYS).", "invalid_api_key")


async def require_admin(request: Request, state: State) -> None:
    """With a token: the bearer must be it (an API key is not enough). Without one: only requests addressed
    to a loopback name, so a web page whose DNS name was rebound to 127.0.0.1 cannot change the policy."""
    token = state.config.admin_token
    if token is not None:
        given = bearer(request)
        if given is None or not matches(given, (token,)):
            raise _unauthorized("admin endpoints need `Authorization: Bearer <admin token>` with the token the "
                                "coordinator was started with (TIERSERVE_ADMIN_TOKEN, --admin-token-file or "
                                "--admin-token)", "invalid_admin_token")
        return
    host = request.headers.get("host", "")
    if not is_loopback(host_without_port(host)):
        raise HTTPException(403, detail={"error": {
            "message": f"this coordinator has no admin token, so its admin API answers only requests addressed to "
                       f"127.0.0.1, localhost or [::1], not to Host {host!r} (a guard against DNS rebinding); "
                       "use a loopback address, or start the coordinator with TIERSERVE_ADMIN_TOKEN set",
            "type": "invalid_request_error", "param": None, "code": "host_not_allowed"}})


ApiKey = Depends(require_api_key)
"""For `dependencies=[ApiKey]` on a route or a router."""
AdminAuth = Depends(require_admin)
