"""Compile a C file of native/ into a shared object on first use, cached per user by source hash.

Nothing is compiled at install or import time: the first wrapper that needs a shim calls
build_shared(), which reuses ``<cache>/<stem>-<hash>.so`` when the same source was built before
with the same flags on the same architecture (then no compiler is needed). The file is written
under a temporary name and renamed, so concurrent first uses (several workers starting at once)
never load a half-written object.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from native import envs
from native.availability import Unavailable

_FLAGS = ("-O2", "-std=gnu11", "-shared", "-fPIC", "-Wall")
_TIMEOUT_S = 120


def find_compiler() -> str | None:
    """gcc (or cc) from PATH, or None."""
    return shutil.which("gcc") or shutil.which("cc")


def build_shared(source: Path, cache_dir: Path | None = None, *, libs: Sequence[str] = ()) -> Path:
    """The path of `source` compiled into a shared object; Unavailable with gcc's message if it can't be.

    `libs` are extra link arguments (e.g. "-ldl"); they are part of the cache key.
    """
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(_FLAGS + tuple(libs)).encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    cache = cache_dir if cache_dir is not None else envs.native_cache_dir()
    out = cache / f"{source.stem}-{key}.so"
    if out.is_file():
        return out
    compiler = find_compiler()
    if compiler is None:
        raise Unavailable(f"unsupported: gcc missing: it is needed once to build {source.name} "
                          "(apt-get install gcc, or any C compiler on PATH as gcc/cc)")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Unavailable(f"unsupported: cannot create the native cache dir {cache}: {e} "
                          "(set TIERSERVE_NATIVE_CACHE to a writable directory)") from e
    fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=cache)
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, "-o", tmp, str(source), *libs]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise Unavailable(f"unsupported: building {source.name} took over {_TIMEOUT_S}s: {' '.join(cmd)}") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise Unavailable(f"unsupported: building {source.name} failed ({' '.join(cmd)}): {tail}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
