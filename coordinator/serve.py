"""`python -m coordinator.serve`: the coordinator's HTTP server alone (the launcher starts it this way)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from coordinator.auth import SecretError, bind_refusal, is_loopback, load_secrets
from coordinator.config import SERVING_BATCH, CoordinatorConfig
from coordinator.planner.durations import duration_arg
from coordinator.protocol import envs
from coordinator.policies.base import BatchPolicyConfig, OffloadConfig, PolicyConfig
from coordinator.policies.sm_partition import SMPartitionConfig
from coordinator.policies.work_stealing import WorkStealingConfig
from coordinator.protocol.logs import setup_logging
from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME

log = logging.getLogger(__name__)

KEEP_ALIVE_S = 65
"""Seconds an idle client connection stays open (above the 5-60 s of common clients and load balancers)."""

def add_coordinator_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default: %(default)s)")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="checkpoint dir (default: the tiny LLaVA)")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="name clients use in `model`")
    p.add_argument("--key-prefix", default="tierserve", help="namespace of all Redis keys")
    p.add_argument("--max-image-bytes", type=int, default=8 * 1024 * 1024, help="largest accepted image")
    p.add_argument("--max-images-per-request", type=int, default=4, help="most images in one request")
    p.add_argument("--max-image-pixels", type=int, default=16 * 1024 * 1024, help="largest width*height accepted")
    p.add_argument("--max-video-frames", type=int, default=32, help="most frames in one video")
    p.add_argument("--max-video-bytes", type=int, default=32 * 1024 * 1024, help="largest video (all frames)")
    p.add_argument("--max-videos-per-request", type=int, default=1, help="most videos in one request")
    p.add_argument("--max-audio-bytes", type=int, default=16 * 1024 * 1024, help="largest encoded audio clip")
    p.add_argument("--max-audio-seconds", type=float, default=30.0,
                   help="longest audio clip (the model's window caps it further)")
    p.add_argument("--max-audios-per-request", type=int, default=4, help="most audio clips in one request")
    p.add_argument("--max-prompt-chars", type=int, default=1 << 20,
                   help="most characters of text over a request's messages, checked before tokenizing; more is "
                        "answered 413 (default: %(default)s)")
    p.add_argument("--prompt-ahead", action=argparse.BooleanOptionalAction, default=False,
                   help="send an image request's encode job first and build its prompt while the encoder runs "
                        "(data-URL images; for a coordinator on cores of its own: on one 2-core host it moved "
                        "~1 ms from before the encoder to after it; default: %(default)s)")
    p.add_argument("--direct-links", action=argparse.BooleanOptionalAction, default=True,
                   help="talk to workers over direct TCP links as well as through Redis: micro-batches to encode "
                        "workers, tokens back from LLM workers (one hop less each way; off loopback it needs "
                        "TIERSERVE_CLUSTER_SECRET; default: %(default)s)")
    p.add_argument("--reply-host", default=None,
                   help="address workers reach the reply link at (default: --host, or this host's name for 0.0.0.0)")
    p.add_argument("--reply-port", type=int, default=0, help="the reply link's TCP port (default: any free one)")
    p.add_argument("--allowed-local-media-dir", type=Path, action="append", default=[],
                   help="directory image_url may name local files under (repeatable)")
    p.add_argument("--request-timeout", type=duration_arg("--request-timeout"), default=120.0, metavar="TIME",
                   help="time before a request is answered 504, with its unit (us, ms, s, min; e.g. 60s; default: 120s)")
    p.add_argument("--migration-limit", type=int, default=3,
                   help="most re-runs of a request whose worker died before it finished (default: %(default)s)")
    p.add_argument("--max-in-flight", type=int, default=256,
                   help="requests admitted at once; more get 429 with Retry-After (default: %(default)s)")
    s = p.add_argument_group("access (secrets are better passed in the environment or a file than as flags)")
    s.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="accept this bearer key on /v1/* (repeatable; visible in `ps`: prefer --api-key-file or "
                        "TIERSERVE_API_KEYS). With none the API is open")
    s.add_argument("--api-key-file", type=Path, default=None, metavar="PATH",
                   help="a file of API keys, one a line (# comments); added to --api-key and TIERSERVE_API_KEYS")
    s.add_argument("--admin-token", default=None,
                   help="require this bearer token on /v1/admin/*; visible to every user in `ps`, so prefer "
                        "--admin-token-file or TIERSERVE_ADMIN_TOKEN. Without a token the admin API answers only "
                        "loopback addresses and the coordinator refuses a non-loopback --host")
    s.add_argument("--admin-token-file", type=Path, default=None, metavar="PATH",
                   help="a file holding the admin token (used when --admin-token is not given)")
    b = p.add_argument_group("encode dispatch (micro-batching) policy; PUT /v1/admin/policy changes it live")
    b.add_argument("--batch-policy", default=SERVING_BATCH.name,
                   choices=["pass_through", "fixed_timeout", "queue_length", "adaptive"], help="(default: %(default)s)")
    b.add_argument("--max-batch", type=int, default=8, help="B: most requests per micro-batch (default: %(default)s)")
    b.add_argument("--fill-probability", type=float, default=0.6, help="adaptive's p (default: %(default)s)")
    b.add_argument("--max-wait", type=duration_arg("--max-wait"), default=1.0, metavar="TIME",
                   help="A: cap on a batch's age, with its unit (e.g. 500ms; default: 1s)")
    b.add_argument("--batch-timeout", type=duration_arg("--batch-timeout"), default=0.05, metavar="TIME",
                   help="fixed_timeout's timeout, with its unit (e.g. 20ms; default: 50ms)")
    b.add_argument("--queue-length", type=int, default=4, help="queue_length's trigger")
    b.add_argument("--work-conserving", action=argparse.BooleanOptionalAction, default=SERVING_BATCH.work_conserving,
                   help="fixed_timeout, queue_length, adaptive: also release what waits whenever the encoder is idle, "
                        "so a batch only forms while the encoder is busy (with --no-work-conserving a request may wait "
                        "up to --max-wait for its batch to fill beside an idle encoder; default: %(default)s)")
    b.add_argument("--offload-share", type=float, default=0.0,
                   help="s: share of prefills run on the encode GPU's co-located prefill worker (default: %(default)s)")
    b.add_argument("--work-stealing", action="store_true",
                   help="let encode GPUs' co-located combined workers take whole requests while the encoder is idle")
    b.add_argument("--max-stolen", type=int, default=4, help="most stolen requests per encode GPU (default: %(default)s)")
    b.add_argument("--steal-load-threshold", type=int, default=1,
                   help="steal only when every remote LLM worker holds at least this many requests (default: %(default)s)")
    b.add_argument("--sm-partition", choices=["none", "static", "dynamic"], default="dynamic",
                   help="SM split between encoder and local prefill on a GPU (default: %(default)s)")


def config_from_args(a: argparse.Namespace, redis_url: str) -> CoordinatorConfig:
    """Raises SecretError when a key file cannot be read or a secret cannot travel in a header."""
    api_keys, admin_token = load_secrets(a.api_key, a.api_key_file, a.admin_token, a.admin_token_file)
    return CoordinatorConfig(api_keys=api_keys,
        redis_url=redis_url, key_prefix=a.key_prefix, host=a.host, port=a.port, model_dir=a.model,
        model_name=a.model_name, max_image_bytes=a.max_image_bytes, max_images_per_request=a.max_images_per_request,
        max_image_pixels=a.max_image_pixels, max_video_frames=a.max_video_frames, max_video_bytes=a.max_video_bytes,
        max_videos_per_request=a.max_videos_per_request, max_audio_bytes=a.max_audio_bytes,
        max_audio_seconds=a.max_audio_seconds, max_audios_per_request=a.max_audios_per_request,
        max_prompt_chars=a.max_prompt_chars, prompt_ahead=a.prompt_ahead, direct_links=a.direct_links,
        reply_host=a.reply_host, reply_port=a.reply_port,
        allowed_local_dirs=tuple(a.allowed_local_media_dir), request_timeout_s=a.request_timeout,
        admin_token=admin_token, migration_limit=a.migration_limit, max_in_flight=a.max_in_flight, policy=PolicyConfig(batch=BatchPolicyConfig(
            name=a.batch_policy, max_batch=a.max_batch, fill_probability=a.fill_probability, max_wait_s=a.max_wait,
            timeout_s=a.batch_timeout, queue_length=a.queue_length, work_conserving=a.work_conserving),
            offload=OffloadConfig(s=a.offload_share),
            stealing=WorkStealingConfig(enabled=a.work_stealing, max_stolen=a.max_stolen,
                                        remote_load_threshold=a.steal_load_threshold),
            partition=SMPartitionConfig(mode=a.sm_partition)),
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from coordinator.app import create_app

    p = argparse.ArgumentParser(prog="python -m coordinator.serve", description="Run the tierserve coordinator.")
    p.add_argument("--redis-url", default=None,
                   help="the cluster's Redis (default: $TIERSERVE_REDIS_URL, else redis://127.0.0.1:6379/0; "
                        "a URL with a password belongs in the environment variable, not here)")
    add_coordinator_args(p)
    a = p.parse_args(argv)
    setup_logging("coordinator")
    try:
        cfg = config_from_args(a, a.redis_url or envs.redis_url())
    except SecretError as e:
        print(f"coordinator: {e}", file=sys.stderr)
        return 2
    refusal = bind_refusal(cfg.host, cfg.admin_token)
    if refusal:  # before binding: an open admin API must never be reachable from the network
        print(f"coordinator: {refusal}", file=sys.stderr)
        return 2
    if not is_loopback(cfg.host) and not cfg.api_keys:
        log.warning("listening on %s with no API key: anyone who reaches it may use /v1; set TIERSERVE_API_KEYS "
                    "or --api-key-file", cfg.host)
    # Keep idle connections longer than clients do (httpx and most SDKs: 5 s, uvicorn's default too): at equal
    # timeouts a client may reuse a connection the server is closing, and its request dies with a ReadError.
    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_config=None, access_log=False,
                timeout_keep_alive=KEEP_ALIVE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
