"""Environment variables of native/. Read only here, and only when a function is called (never at import).

- ``TIERSERVE_LIBSMCTRL``: path to a user-built ``libsmctrl.so`` (see native/README.md). An explicit
  ``lib_path`` argument wins over it.
- ``TIERSERVE_NATIVE_CACHE``: where compiled shims are kept. Default ``$XDG_CACHE_HOME/tierserve/native``,
  else ``~/.cache/tierserve/native``.
"""

from __future__ import annotations

import os
from pathlib import Path


def libsmctrl_path() -> str | None:
    """TIERSERVE_LIBSMCTRL, or None when unset or empty."""
    return os.environ.get("TIERSERVE_LIBSMCTRL") or None


def native_cache_dir() -> Path:
    """Directory for shared objects built from native/*.c (created on first build, not here)."""
    explicit = os.environ.get("TIERSERVE_NATIVE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierserve" / "native"
