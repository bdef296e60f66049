"""What every worker process is configured with, and the CLI flags that set it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretBytes, field_validator

from coordinator.protocol import envs
from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[DType, ...] = get_args(DType)
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")
"""What --device accepts: the CPU, or one CUDA device (cuda alone is cuda:0)."""


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
    """This host's address as the cluster reaches it (default 127.0.0.1, one host only): where the tcp transport's
    receiver and an encode worker's job link (encode_node/job_inbox.py) bind and what they publish; set it to this
    host's cluster-internal address for multi-host clusters. ucx and nixl publish every interface they find and
    ignore it."""
    cluster_secret: SecretBytes | None = None
    """Authenticates every tensor transfer between the cluster's workers (transport/auth.py); read from
    TIERSERVE_CLUSTER_SECRET or TIERSERVE_CLUSTER_SECRET_FILE (envs.py), never a flag (`ps` shows flags).
    None: receivers take tensors from anyone who can reach them, so one trusted host only."""
    transport_max_unclaimed_mib: int = Field(1024, ge=1)
    """MiB of tensors this worker's receiver holds arrived but not yet claimed; transfers beyond are refused."""
    transport_max_request_mib: int = Field(512, ge=1)
    """MiB of unclaimed tensors one request may hold at this worker's receiver."""
    transport_unclaimed_ttl_s: float = Field(60.0, gt=0)
    """Seconds an unclaimed request's tensors are kept before they are dropped (and counted as expired)."""
    tier: str = "cpu"
    """GPU tier name from the catalog, or "cpu"."""
    device: str = "cpu"
    """Where the model's weights and forwards live: "cpu" or "cuda:N" (the tier is only a label; this places it)."""
    dtype: DType = "float32"
    """The weights' and activations' dtype; float32 is the exactness oracle, bfloat16 the usual GPU choice."""
    heartbeat_ttl_s: float = Field(2.0, gt=0)
    """A worker silent this long has left routing (it beats every ttl/4); the coordinator re-runs its requests."""

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        try:
            return device_arg(v)
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None

    def torch_dtype(self):
        """The torch dtype of `dtype` (imports torch)."""
        import torch

        return getattr(torch, self.dtype)

    def check_device(self) -> None:
        """SystemExit with the reason unless `device` exists in this process (call it before loading a model)."""
        require_device(self.device)

    def receiver_options(self) -> dict:
        """Keyword arguments for transport.registry.make_receiver beyond the backend and worker id."""
        opts: dict = {"max_unclaimed_bytes": self.transport_max_unclaimed_mib << 20,
                      "max_request_bytes": self.transport_max_request_mib << 20,
                      "ttl": self.transport_unclaimed_ttl_s, **self.sender_options()}
        if self.transport == "tcp" and self.transport_host:
            opts["host"] = self.transport_host
        return opts

    def sender_options(self) -> dict:
        """Keyword arguments for transport.registry.make_sender beyond the backend: the cluster secret."""
        return {"secret": self.cluster_secret.get_secret_value()} if self.cluster_secret is not None else {}


def add_worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worker-id", required=True, help="unique id in the cluster registry")
    p.add_argument("--redis-url", default=None,
                   help="the cluster's Redis (default: $TIERSERVE_REDIS_URL, else redis://127.0.0.1:6379/0)")
    p.add_argument("--key-prefix", default="tierserve", help="namespace of all Redis keys")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="local checkpoint dir (default: tiny LLaVA)")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="name the cluster serves the model under")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--transport", default="local", help="tensor transport backend: local, tcp, ucx or nixl")
    p.add_argument("--transport-host", default=None,
                   help="address to bind and publish for the tcp transport and an encode worker's job link "
                        "(default 127.0.0.1; this host's cluster-internal one across hosts)")
    p.add_argument("--transport-max-unclaimed-mib", type=int, default=1024,
                   help="MiB of arrived, unclaimed tensors this worker's receiver holds before it refuses transfers")
    p.add_argument("--transport-max-request-mib", type=int, default=512,
                   help="MiB of unclaimed tensors one request may hold at this worker's receiver")
    p.add_argument("--transport-unclaimed-ttl-s", type=float, default=60.0,
                   help="seconds unclaimed tensors are kept before they are dropped")
    p.add_argument("--tier", default="cpu", help="GPU tier name from the catalog, or cpu (a label; --device places)")
    p.add_argument("--device", default="cpu", type=device_arg,
                   help="where the model runs: cpu or cuda:N (default: %(default)s)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="weights and activations: float32 (exact, the default), bfloat16 or float16")


def worker_fields(a: argparse.Namespace) -> dict:
    return {"worker_id": a.worker_id, "redis_url": a.redis_url or envs.redis_url(), "key_prefix": a.key_prefix, "model_dir": a.model,
            "model_name": a.model_name, "threads": a.threads, "transport": a.transport,
            "transport_host": a.transport_host, "tier": a.tier, "cluster_secret": envs.cluster_secret(),
            "transport_max_unclaimed_mib": a.transport_max_unclaimed_mib,
            "transport_max_request_mib": a.transport_max_request_mib,
            "transport_unclaimed_ttl_s": a.transport_unclaimed_ttl_s, "device": a.device, "dtype": a.dtype}


def device_arg(text: str) -> str:
    """argparse type of --device: cpu, cuda or cuda:N, else a usage error naming the forms."""
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu or cuda:N (e.g. cuda:0)")
    return "cuda:0" if text == "cuda" else text


def require_device(device: str) -> None:
    """SystemExit naming what is missing unless torch can use `device` here (cpu always can)."""
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no usable CUDA driver or GPU"
        raise SystemExit(f"--device {device}: torch {torch.__version__} sees no CUDA device here ({build}); "
                         "use --device cpu, or run this worker on a GPU host")
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise SystemExit(f"--device {device}: this host has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
