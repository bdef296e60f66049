"""Every environment variable the coordinator and the workers read, typed and documented, read only when
called (never at import). Secrets travel this way, or in files these name, so that they never appear on
a process's command line (`ps` shows every user the arguments, not the environment).

`tierserve up` sets them for the processes it starts; a hand-run process may set them itself.
"""

from __future__ import annotations

import os
from pathlib import Path

REDIS_URL = "TIERSERVE_REDIS_URL"
"""The cluster's Redis URL (it may hold a password: redis://:PASSWORD@host:port/db). A `--redis-url`
flag wins over it."""
CLUSTER_SECRET = "TIERSERVE_CLUSTER_SECRET"
"""The per-cluster secret that authenticates tensor transfers between workers (hex or any text)."""
CLUSTER_SECRET_FILE = "TIERSERVE_CLUSTER_SECRET_FILE"
"""A file holding the cluster secret (mode 0600), read when TIERSERVE_CLUSTER_SECRET is unset."""
API_KEYS = "TIERSERVE_API_KEYS"
"""Comma-separated API keys accepted on /v1/* (the coordinator)."""
API_KEYS_FILE = "TIERSERVE_API_KEYS_FILE"
"""A file with one API key per line (blank lines and lines starting with # ignored)."""
ADMIN_TOKEN = "TIERSERVE_ADMIN_TOKEN"
"""The bearer token /v1/admin/* requires (the coordinator)."""
ADMIN_TOKEN_FILE = "TIERSERVE_ADMIN_TOKEN_FILE"
"""A file holding the admin token, read when TIERSERVE_ADMIN_TOKEN is unset."""


def _value_or_file(name: str, file_name: str) -> str | None:
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(file_name)
    if path:
        text = Path(path).read_text().strip()
        return text or None
    return None


def redis_url(default: str = "redis://127.0.0.1:6379/0") -> str:
    return os.environ.get(REDIS_URL) or default


def cluster_secret() -> bytes | None:
    """The cluster secret as bytes, or None when none is set (transfers are then unauthenticated)."""
    value = _value_or_file(CLUSTER_SECRET, CLUSTER_SECRET_FILE)
    return value.encode() if value else None


def key_lines(path: str | Path) -> list[str]:
    """The format of an API key file: one key a line, blank lines and # comments skipped."""
    return [s for line in Path(path).read_text().splitlines() if (s := line.strip()) and not s.startswith("#")]


def api_keys() -> list[str]:
    keys = [k.strip() for k in (os.environ.get(API_KEYS) or "").split(",") if k.strip()]
    path = os.environ.get(API_KEYS_FILE)
    return keys + (key_lines(path) if path else [])


def admin_token() -> str | None:
    return _value_or_file(ADMIN_TOKEN, ADMIN_TOKEN_FILE)
