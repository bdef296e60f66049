"""What a run measures: an OpenAI-compatible URL, a local tierserve cluster started for the run, or
the planner's simulator (sim_target.py); and the checks that a URL really is an OpenAI chat server
before any load.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from benchmarks.bench.presets import Preset, read_policy

if TYPE_CHECKING:  # the launcher is imported only when a local cluster is started
    from coordinator.launcher import ClusterSpec


class TargetError(RuntimeError):
    """A target that cannot be benchmarked; the message says what was tried and what to check."""


@dataclass(frozen=True)
class Target:
    label: str
    kind: Literal["url", "local", "sim", "vllm"]
    """url: a running server; local: a tierserve cluster started for the run; vllm: plain `vllm serve`
    started for the run (benchmarks/bench/vllm_server.py); sim: the planner's simulator."""
    url: str = ""
    """Base URL without /v1 (kind url)."""
    plan: Path | None = None
    """The plan file (kind sim)."""
    engine: Literal["reference", "vllm"] = "reference"
    """The local cluster's LLM engine (kind local: `local` or `local-vllm`)."""


@dataclass
class TargetInfo:
    """What the preflight learnt about a running target."""

    url: str
    models: list[str]
    policy: dict[str, Any] | None
    """The tierserve policy before the run (None: not a tierserve coordinator)."""
    workers: list[dict[str, Any]] = field(default_factory=list)
    """GET /v1/cluster's workers on a tierserve coordinator."""


def parse_target(text: str) -> Target:
    """"local", "sim", "sim:PLAN.yaml", "URL", each optionally "NAME=..."."""
    name, eq, rest = text.partition("=")
    label, value = (name.strip(), rest.strip()) if eq and not name.startswith("http") else ("", text.strip())
    if value in ("local", "local-vllm"):
        return Target(label=label or value, kind="local", engine="vllm" if value == "local-vllm" else "reference")
    if value == "vllm":
        return Target(label=label or value, kind="vllm")
    if value == "sim" or value.startswith("sim:"):
        plan = Path(value[4:]) if value.startswith("sim:") and value[4:] else None
        return Target(label=label or (f"sim:{plan.stem}" if plan else "sim"), kind="sim", plan=plan)
    if not re.match(r"^https?://[^/\s]+", value):
        raise TargetError(f"--target {text!r}: give an http(s) URL of an OpenAI-compatible server "
                          "(e.g. http://127.0.0.1:8000), `local`, `local-vllm`, `vllm`, or `sim:PLAN.yaml`")
    url = re.sub(r"/v1/?$", "", value.rstrip("/"))
    return Target(label=label or re.sub(r"^https?://", "", url), kind="url", url=url)


def preflight(url: str, headers: dict[str, str], admin_headers: dict[str, str]) -> TargetInfo:
    """GET /v1/models (and, for tierserve, the policy and workers); clear errors instead of tracebacks."""
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=10)
    except httpx.ConnectError as e:
        raise TargetError(f"cannot reach {url} ({e}); is the server running, and is --target right?") from None
    except httpx.TimeoutException:
        raise TargetError(f"{url} did not answer GET /v1/models within 10 s") from None
    except httpx.HTTPError as e:
        raise TargetError(f"GET {url}/v1/models failed: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise TargetError(f"{url} refused GET /v1/models (HTTP {r.status_code}); pass --api-key")
    if r.status_code != 200:
        raise TargetError(f"{url} is not an OpenAI-compatible server: GET /v1/models answered HTTP {r.status_code} "
                          f"({r.text[:120]!r}); point --target at the server's base URL")
    try:
        data = r.json().get("data")
    except (ValueError, AttributeError):
        data = None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise TargetError(f"{url} is not an OpenAI-compatible server: GET /v1/models did not answer "
                          f"{{\"data\": [{{\"id\": ...}}]}} (got {r.headers.get('content-type', '?')}: {r.text[:120]!r})")
    info = TargetInfo(url=url, models=[m["id"] for m in data], policy=None)
    with httpx.Client(base_url=url, headers=admin_headers, timeout=10) as admin:
        info.policy = read_policy(admin)
        if info.policy is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
                info.workers = admin.get("/v1/cluster").json().get("workers", [])
    return info


@dataclass(frozen=True)
class LocalOptions:
    """How `--target local` builds its cluster."""

    model: Path | None = None
    encode_workers: int = 1
    pin_cores: bool = True
    """One emulated device per core (see ClusterSpec.pin_cores), so co-located workers share a core."""
    threads: int = 1
    """Torch threads of each worker process."""
    log_dir: Path | None = None


def local_spec(presets: list[Preset], opts: LocalOptions, engine: str = "reference") -> ClusterSpec:
    """One cluster with the workers every preset needs: a remote combined worker always; a decode
    worker and a co-located prefill worker when a preset offloads; a co-located stealer when one steals."""
    from coordinator.launcher import ClusterSpec
    from coordinator.redis_server import free_port

    local_prefill = any(p.needs_local_prefill for p in presets)
    kw: dict[str, Any] = {"model_dir": opts.model} if opts.model else {}
    # A prefix of its own: workers' transport sockets are named after it, and other clusters may be up.
    return ClusterSpec(key_prefix=f"bench-{uuid.uuid4().hex[:8]}", encode_workers=opts.encode_workers,
                       llm_roles=["combined"] + (["decode"] if local_prefill else []),
                       local_prefill=local_prefill, steal=any(p.needs_stealer for p in presets),
                       pin_cores=opts.pin_cores, threads=opts.threads, port=free_port(),
                       llm_args=["--engine", engine] if engine != "reference" else [], **kw)


@contextlib.contextmanager
def open_target(target: Target, presets: list[Preset], local: LocalOptions, say) -> Iterator[str]:
    """Yield the base URL to send requests to, starting (and afterwards stopping) a local cluster."""
    if target.kind == "vllm":
        yield from _plain_vllm(local, say)
        return
    if target.kind != "local":
        yield target.url
        return
    from coordinator.launcher import ClusterError, LocalCluster
    from coordinator.redis_server import RedisNotFound

    try:
        spec = local_spec(presets, local, target.engine)
        cluster = LocalCluster(spec, local.log_dir)
        say(f"starting a local cluster: {spec.encode_workers} encode, llm {','.join(spec.llm_roles)} on the "
            f"{target.engine} engine"
            f"{', local prefill' if spec.local_prefill else ''}{', stealer' if spec.steal else ''}"
            f" (logs: {cluster.log_dir})")
        cluster.start(timeout_s=180)
    except (ClusterError, RedisNotFound) as e:
        raise TargetError(f"--target local: {e}") from None
    try:
        yield cluster.url
    finally:
        cluster.stop()


def _plain_vllm(local: LocalOptions, say) -> Iterator[str]:
    from benchmarks.bench.vllm_server import VllmServerError, plain_vllm
    from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME

    model = local.model or DEFAULT_MODEL_DIR
    try:
        with plain_vllm(model, DEFAULT_MODEL_NAME if model == DEFAULT_MODEL_DIR else model.name, local.log_dir,
                        say) as url:
            yield url
    except VllmServerError as e:
        raise TargetError(f"--target vllm: {e}") from None
