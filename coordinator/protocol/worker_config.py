"""What every worker process is configured with, and the CLI flags that set it."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME


class WorkerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, protected_namespaces=())

    worker_id: str
    """Unique in the cluster's registry."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "tierserve"
    """Namespace of every Redis key; clusters or test runs sharing one Redis use different prefixes."""
    model_dir: Path = DEFAULT_MODEL_DIR
    """A local transformers checkpoint (config, processor, safetensors)."""
    model_name: str = DEFAULT_MODEL_NAME
    threads: int = Field(1, ge=1)
    """torch intra-op threads; set explicitly so co-located processes don't oversubscribe cores."""
    transport: str = "local"
    """Tensor transport backend (transport/registry.py)."""
    transport_host: str | None = None
    """tcp transport: the address its receiver binds and publishes (default 127.0.0.1, one host only); set
    it to this host's cluster-internal address for multi-host clusters. ucx and nixl publish every
    interface they find and ignore it."""
    tier: str = "cpu"
    """GPU tier name from the catalog, or "cpu"."""
    heartbeat_ttl_s: float = Field(10.0, gt=0)

    def receiver_options(self) -> dict:
        """Keyword arguments for transport.registry.make_receiver beyond the backend and worker id."""
        return {"host": self.transport_host} if self.transport == "tcp" and self.transport_host else {}


def add_worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worker-id", required=True, help="unique id in the cluster registry")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--key-prefix", default="tierserve", help="namespace of all Redis keys")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="local checkpoint dir (default: tiny LLaVA)")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="name the cluster serves the model under")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--transport", default="local", help="tensor transport backend: local, tcp, ucx or nixl")
    p.add_argument("--transport-host", default=None,
                   help="tcp transport: address to bind and publish (default 127.0.0.1; a cluster-internal one across hosts)")
    p.add_argument("--tier", default="cpu", help="GPU tier name from the catalog, or cpu")


def worker_fields(a: argparse.Namespace) -> dict:
    return {"worker_id": a.worker_id, "redis_url": a.redis_url, "key_prefix": a.key_prefix, "model_dir": a.model,
            "model_name": a.model_name, "threads": a.threads, "transport": a.transport,
            "transport_host": a.transport_host, "tier": a.tier}
