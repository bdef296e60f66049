"""The coordinator's settings; built from CLI flags (or a file), never at import time."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coordinator.policies.base import BatchPolicyConfig, PolicyConfig
from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME


SERVING_BATCH = BatchPolicyConfig(name="adaptive", work_conserving=True)
"""The coordinator's encode dispatch at start unless told otherwise: adaptive micro-batching that releases to an
idle encoder at once, so batches form only while the encoder is busy. Against pass-through on the 2-core CPU
cluster it served 5-9 % more requests a second at saturation in four runs of four, with TTFT at 1, 4 and 16 req/s
within the noise (benchmarks/results/bench-vllm-fast-host/summary.md). The planner's own default (a Deployment's
BatchPolicyConfig()) stays pass-through: its plans name their policy in full."""


class CoordinatorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, protected_namespaces=())

    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "tierserve"
    """Namespace of every Redis key; clusters or test runs sharing one Redis use different prefixes."""
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model_dir: Path = DEFAULT_MODEL_DIR
    """Checkpoint whose processor (tokenizer, chat template, image size) the API uses."""
    model_name: str = DEFAULT_MODEL_NAME
    """The name clients put in `model`; anything else is answered 404."""
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1)
    max_images_per_request: int = Field(4, ge=0)
    max_image_pixels: int = Field(16 * 1024 * 1024, ge=1)
    """Largest width*height; a decoded RGB image costs 3 bytes a pixel on the encode worker."""
    max_video_frames: int = Field(32, ge=1)
    max_video_bytes: int = Field(32 * 1024 * 1024, ge=1)
    max_videos_per_request: int = Field(1, ge=0)
    max_audio_bytes: int = Field(16 * 1024 * 1024, ge=1)
    max_audio_seconds: float = Field(30.0, gt=0)
    """The model's own window (e.g. Whisper's 30 s) caps it further."""
    max_audios_per_request: int = Field(4, ge=0)
    max_prompt_chars: int = Field(1 << 20, ge=1)
    """Most characters of text over all messages; more is answered 413 before anything is tokenized."""
    prompt_ahead: bool = False
    """Send an image request's encode job before its prompt is built, and build it while the encoder runs
    (coordinator/prompt_ahead.py). Off by default: on a 2-core host that runs every process it took ~1.1 ms off
    the way to the encoder and added as much after it (the coordinator's work then meets the LLM worker's)."""
    direct_links: bool = True
    """Talk to workers over direct TCP links beside Redis (coordinator/protocol/link_wire.py): LLM workers write
    their token events to this coordinator's reply listener, and it writes micro-batches to each encode worker's job
    link; one process hop less on each request's way in and every token's way out. Off a loopback address a link
    needs the cluster secret (TIERSERVE_CLUSTER_SECRET); without one the streams carry everything."""
    reply_host: str | None = None
    """The address workers reach the reply link at; None: `host` (this host's name when `host` is a wildcard)."""
    reply_port: int = Field(0, ge=0, le=65535)
    """The reply link's TCP port; 0: any free one (it travels in every job)."""
    allowed_local_dirs: tuple[Path, ...] = ()
    """Directories from which `image_url` may name local files; empty means no local files."""
    media_ttl_s: int = Field(300, ge=1)
    """How long stored media lives in Redis if its request never gets encoded."""
    request_timeout_s: float = Field(120.0, gt=0)
    """A request with no final token by then is answered 504 and aborted."""
    policy: PolicyConfig = PolicyConfig(batch=SERVING_BATCH)
    """Micro-batching and offload knobs at start; changeable at run time (PUT /v1/admin/policy)."""
    heartbeat_ttl_s: float = Field(2.0, gt=0)
    """A worker whose heartbeat is older than this has left routing (workers beat every ttl/4)."""
    migration_limit: int = Field(3, ge=0)
    """Most re-runs of one request after the workers holding it died (Dynamo's --migration-limit);
    past it, or when no worker can take it, the client gets an explicit error."""
    max_in_flight: int = Field(256, ge=1)
    """Requests admitted at once; beyond it a request is answered 429 with Retry-After."""
    admin_token: str | None = Field(None, repr=False)
    """If set, /v1/admin/* requires `Authorization: Bearer <token>`; unset suits a loopback-only cluster (the
    admin API then answers only requests addressed to a loopback name, and serve refuses other binds)."""
    api_keys: tuple[str, ...] = Field((), repr=False)
    """Keys accepted as `Authorization: Bearer <key>` on /v1/* (not /v1/admin/*, /health or /metrics);
    empty leaves the API open, as suits a loopback-only cluster. Secrets are kept out of repr (logs);
    `coordinator.auth.secret_problem` checks them without printing them."""
