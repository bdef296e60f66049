"""Transport backends by name, imported only when chosen, so the CPU suite never needs GPU packages."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.base import EmbeddingReceiver, EmbeddingSender, TransportError

log = logging.getLogger(__name__)
_UCX_LIBS = {"ucx", "nixl"}
"""Backends that bring their own copy of UCX (ucxx's libucx wheel, NIXL's bundled one)."""
_loaded: set[str] = set()


@dataclass(frozen=True)
class _Backend:
    module: str
    sender: str
    receiver: str
    package: str
    """The module the backend needs beyond tierserve's own dependencies ("" if none)."""
    install: str = ""
    """The command that installs it (NIXL's wheel must skip its dependencies, which pull a 5.7 GB CUDA torch)."""


_BACKENDS = {
    "local": _Backend("transport.local", "LocalSender", "LocalReceiver", ""),
    "tcp": _Backend("transport.tcp", "TcpSender", "TcpReceiver", ""),
    "ucx": _Backend("transport.ucx", "UcxSender", "UcxReceiver", "ucxx", "pip install ucxx-cu12"),
    "nixl": _Backend("transport.nixl", "NixlSender", "NixlReceiver", "nixl_cu12",
                     "pip install --no-deps nixl-cu12==1.5.1"),
}


def unavailable(kind: str) -> str | None:
    """Why backend `kind` cannot run here (naming the pip command that fixes it), or None if it can."""
    backend = _BACKENDS.get(kind)
    if backend is None:
        return f"unknown transport {kind!r}; known: {sorted(_BACKENDS)}"
    if backend.package:
        try:
            found = importlib.util.find_spec(backend.package) is not None
        except (ImportError, ValueError):  # a broken or blocked install counts as missing
            found = False
        if not found:
            return f"the {kind} transport needs the {backend.package} module: {backend.install}"
    return None


def _load(kind: str, attr: str) -> Any:
    backend = _BACKENDS.get(kind)
    if backend is None:
        raise ValueError(f"unknown transport {kind!r}; known: {sorted(_BACKENDS)}")
    reason = unavailable(kind)
    if reason is not None:
        raise TransportError(f"{reason}; or choose transport 'tcp' (any hosts) or 'local' (one host)")
    module = importlib.import_module(backend.module)
    _loaded.add(kind)
    if _UCX_LIBS <= _loaded:
        log.warning("ucx and nixl transports are both loaded in this process: each brings its own UCX, and "
                    "side by side NIXL's one-host transfers ran ~8x slower (4.5 MB: 1.3 -> 11 ms); give each "
                    "its own process (one transport per worker, as `--transport` does)")
    return getattr(module, getattr(backend, attr))


def default_local_address(worker_id: str, runtime_dir: str | os.PathLike | None = None) -> str:
    """unix://<runtime_dir>/<worker_id>.sock; the directory defaults to $TMPDIR/tierserve-<uid>, private to the user."""
    if not worker_id or "/" in worker_id or "\0" in worker_id or worker_id.startswith("."):
        raise ValueError(f"worker id {worker_id!r} cannot name a socket file (no '/', NUL or leading '.')")
    base = Path(runtime_dir) if runtime_dir is not None else Path(tempfile.gettempdir()) / f"tierserve-{os.getuid()}"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.stat().st_uid != os.getuid():  # e.g. pre-created in a shared /tmp by someone else
        raise TransportError(f"{base} belongs to uid {base.stat().st_uid}, not {os.getuid()}; pick another runtime_dir")
    return f"unix://{base / worker_id}.sock"


def make_sender(kind: str, *, secret: bytes | None = None, **opts: Any) -> EmbeddingSender:
    """A sender of the named backend; `opts` go to its constructor (e.g. timeout for local).

    `secret`: the cluster's secret; every transfer then carries an HMAC stamp that receivers with the same
    secret require (transport/auth.py). None (the default) is for one trusted host only."""
    if secret is not None:
        opts["secret"] = secret
    return _load(kind, "sender")(**opts)


def make_receiver(kind: str, worker_id: str, *, secret: bytes | None = None, **opts: Any) -> EmbeddingReceiver:
    """A receiver of the named backend for one worker.

    `secret`: the cluster's secret; it then refuses transfers without a good stamp (transport/auth.py).
    Every backend also takes `ttl` (seconds an unclaimed request is kept, default 60),
    `max_unclaimed_bytes` (default 1 GiB) and `max_request_bytes` (default 512 MiB): transport/admission.py.

    For "local": `address` if given; else tcp on a free loopback port when `tcp=True`; else a Unix socket
    from `default_local_address(worker_id, runtime_dir)`. The remaining `opts` (ttl, max_payload) go to
    the receiver. Other backends get `worker_id` and `opts` as they are: "tcp" takes host/port/advertise
    (default 127.0.0.1 on a free port), "ucx" and "nixl" publish their worker address / agent metadata as
    their address and need no options (see transport/README.md for the tuning knobs).
    """
    cls = _load(kind, "receiver")
    if secret is not None:
        opts["secret"] = secret
    if kind != "local":
        return cls(worker_id, **opts)
    address = opts.pop("address", None)
    tcp = opts.pop("tcp", False)
    runtime_dir = opts.pop("runtime_dir", None)
    if address is None:
        address = "tcp://127.0.0.1:0" if tcp else default_local_address(worker_id, runtime_dir)
    return cls(address, **opts)
