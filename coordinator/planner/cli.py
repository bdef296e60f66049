"""`tierserve plan` and `tierserve profile`: the planner's two commands.

    tierserve plan --rate 5 --slo ttft=2s,tpot=100ms --gpus 2xRTX4090,2xA100 --model llava-1.5-7b
    tierserve plan --rate 5 --slo ttft=2s,tpot=100ms --budget 20 --storage sqlite:///plan.db
    tierserve profile                          # a local 1 encode + 1 combined cluster, pinned to cores
    tierserve profile --url http://host:8000   # a running cluster of one encode and one combined worker

`add_parser` / `add_profile_parser` register the subcommands (importing nothing heavy, so
`tierserve --help` stays fast); `run` / `run_profile` do the work. Bad input never ends in a
traceback: it prints what is wrong and what to do, and exits 2.
"""

from __future__ import annotations

import argparse
import math

from coordinator.planner.durations import parse_duration_s, parse_targets

EXAMPLES = """examples:
  tierserve plan --rate 5 --slo ttft=2s,tpot=100ms --gpus 2xRTX4090,2xA100 --model llava-1.5-7b
  tierserve plan --rate 5 --slo ttft=2s,tpot=100ms --budget 20 --trials 30 --out plan.yaml
  tierserve plan --rate 5 --slo ttft=5s,tpot=150ms --gpus 8xA100 --model ultravox --modality audio \\
      --storage sqlite:///plan.db   # run again with the same flags to continue the study
  tierserve plan --rate 4 --slo ttft=1s,tpot=100ms --model tiny-llava --live http://127.0.0.1:8000 --trials 8
  tierserve plan --rate 2 --slo ttft=10s,tpot=100ms --gpus 4xRTX4090 --model llava-v1.6-34b --dtypes bf16,int8
"""

def parse_duration(text: str, what: str) -> float:
    """"2s", "100ms", "2000" (a bare number is milliseconds) -> seconds; see durations.py."""
    return parse_duration_s(text, what, bare="ms")


def parse_slo(text: str) -> tuple[float, float]:
    """"ttft=2s,tpot=100ms" (or ttft=2000,tpot=100: milliseconds) -> (ttft_s, tpot_s); both keys required."""
    found = parse_targets(text, ("ttft", "tpot"), ("ttft", "tpot"), "--slo", "ttft=2s,tpot=100ms")
    return found["ttft"], found["tpot"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `plan` on the `tierserve` command's subparsers."""
    p = subparsers.add_parser("plan", help="search the cheapest deployment meeting an SLO; write a plan file",
                              description="Plan a deployment for an arrival rate and an SLO. HAS stage 1 (queueing\n"
                              "model) prunes the GPU layouts; stage 2 (Optuna TPE, trials on the simulator) tunes\n"
                              "B, s, the SM split and stealing for goodput per dollar. Prints the plan and writes\n"
                              "the plan file.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, required=True, help="planned arrival rate, req/s (Lambda)")
    p.add_argument("--slo", required=True,
                   help="latency targets TTFT and TPOT with units (us, ms, s, min), e.g. ttft=2s,tpot=100ms; "
                        "a bare number is milliseconds (ttft=2000 is 2 s), as in `tierserve bench --goodput`")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--budget", type=float, help="$/h to spend; tiers are chosen from the catalog")
    where.add_argument("--gpus", help="GPU inventory to plan on, e.g. 2xRTX4090,2xA100")
    where.add_argument("--live", metavar="URL",
                       help="run the trials on the cluster at this coordinator URL (its layout, read from "
                            "/v1/cluster, is kept: only the knobs are searched); its policy is restored after")
    p.add_argument("--model", default="llava-1.5-7b",
                   help="model preset, tiny-llava or a checkpoint dir (default: %(default)s)")
    p.add_argument("--modality", choices=["image", "video", "audio"],
                   help="workload modality (default: the model's first)")
    p.add_argument("--trials", type=int, default=30, help="trial budget (default: %(default)s, as EAServe)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default: %(default)s)")
    p.add_argument("--method", choices=["has", "random", "coordinate"], default="has",
                   help="searcher: HAS (default) or a baseline")
    p.add_argument("--out", default="plan.yaml", help="plan file to write (default: %(default)s)")
    p.add_argument("--storage", help="RDB URL making the HAS study resumable, e.g. sqlite:///plan.db")
    p.add_argument("--study-name", help="study name in --storage (default: derived from the problem)")
    p.add_argument("--requests", type=int, default=100, help="requests per trial (default: %(default)s)")
    p.add_argument("--predict-requests", type=int, default=2000,
                   help="requests of the final prediction run (default: %(default)s)")
    p.add_argument("--tiers", help="with --budget: comma list of tiers to choose from (default: every GPU tier)")
    p.add_argument("--max-gpus", type=int, default=8, help="with --budget: most GPUs (default: %(default)s)")
    p.add_argument("--max-utilisation", type=float, default=0.85,
                   help="stage 1 drops layouts busier than this at any stage (default: %(default)s)")
    p.add_argument("--catalog", action="append", default=[], help="user catalog YAML merged over the built-in one")
    p.add_argument("--profile", action="append", default=[], metavar="PATH",
                   help="measured service times (a `tierserve profile` JSON, or a directory of them; repeatable): "
                        "their tiers use the measurements, others the roofline; several of one tier are pooled")
    p.add_argument("--dtypes", default="bf16",
                   help="LLM weight dtypes the search may use, comma list of bf16, fp8, int8 (fp8/int8 change the "
                        "model's outputs: opt in; the engine here runs bf16 only, so such plans are simulated only; "
                        "default: %(default)s)")
    p.add_argument("--tp", default="1,2,4",
                   help="tensor-parallel degrees of LLM workers the search may use, comma list of 1, 2, 4 (TP > 1 is "
                        "simulated only here; default: %(default)s)")
    p.add_argument("--host", default="node0", help="host name written for every GPU (default: %(default)s)")
    p.add_argument("--admin-token", help="with --live: the coordinator's --admin-token, if it has one")
    return p


def _request(a: argparse.Namespace):
    from coordinator.planner.goodput import SLO
    from coordinator.planner.planning import PlanRequest

    ttft, tpot = parse_slo(a.slo)
    for name in ("trials", "requests", "predict_requests"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if not a.rate > 0 or math.isinf(a.rate):
        raise ValueError(f"--rate must be a positive number of requests per second, got {a.rate}")
    if a.budget is not None and not a.budget > 0:
        raise ValueError(f"--budget must be a positive $/h, got {a.budget}")
    tiers = tuple(t.strip() for t in a.tiers.split(",") if t.strip()) if a.tiers else None
    variants = _variants(a.dtypes, a.tp)
    return PlanRequest(variants=variants, model=a.model, modality=a.modality, rate=a.rate, slo=SLO(ttft_s=ttft, tpot_s=tpot),
                       budget_per_hour=a.budget, gpus=a.gpus, tiers=tiers, max_gpus=a.max_gpus,
                       requests_per_trial=a.requests, prediction_requests=a.predict_requests,
                       max_utilisation=a.max_utilisation, workload_seed=0, host=a.host,
                       catalog_files=tuple(a.catalog), profile_files=tuple(a.profile))


def _variants(dtypes: str, tp: str):
    from coordinator.planner.variants import DTYPES, TP_DEGREES, VariantSpace

    names = tuple(d.strip().lower() for d in dtypes.split(",") if d.strip())
    unknown = [d for d in names if d not in DTYPES]
    if unknown or not names:
        raise ValueError(f"--dtypes {dtypes!r}: give a comma list of {', '.join(DTYPES)}")
    degrees = parse_counts(tp, "--tp")
    if set(degrees) - set(TP_DEGREES):
        raise ValueError(f"--tp {tp!r}: tensor-parallel degrees are some of {', '.join(map(str, TP_DEGREES))}")
    return VariantSpace(dtypes=names, tp=degrees)


def run(a: argparse.Namespace) -> int:
    """Plan, print, write; 0 on success, 2 on bad input (with the reason printed)."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.markup import escape as markup_escape

    from coordinator.planner.live_http import LiveClusterError

    console = Console()
    try:
        from coordinator.planner.planning import make_plan, prepare, search
        from coordinator.planner.report import print_plan, search_progress

        deployed = None
        if a.live:
            from coordinator.planner.catalog import load_catalog
            from coordinator.planner.live_plan import live_search, read_deployed

            deployed = read_deployed(a.live, load_catalog(*a.catalog), a.admin_token)
            tiers: dict[str, int] = {}
            for g in deployed.groups:
                tiers[g.tier] = tiers.get(g.tier, 0) + g.count
            a.gpus = ",".join(f"{n}x{t}" for t, n in tiers.items())
            console.print(f"live: the cluster at {a.live} runs {deployed.label()}; its knobs are searched there")
        req = _request(a)
        with console.status("stage 1: capacities, allocations, queueing model..."):
            ctx = prepare(req)
        s1 = ctx.stage1
        console.print(markup_escape(f"stage 1: {s1.considered} allocations, {s1.feasible} under {req.max_utilisation:.0%} load at "
                      f"{req.rate:g} req/s, kept {len(s1.candidates)}: "
                      + "; ".join(c.allocation.label() for c in s1.candidates)))
        with search_progress(console, a.method, a.trials) as on_trial:
            if deployed is not None:
                result = live_search(ctx, a.live, deployed, a.method, a.trials, a.seed, a.admin_token, a.storage,
                                     a.study_name, on_trial)
            else:
                result = search(ctx, a.method, a.trials, a.seed, a.storage, a.study_name, on_trial)
        plan = make_plan(ctx, result, a.seed, a.storage)
        path = plan.save(a.out)
    except (ValueError, ValidationError, KeyError, LiveClusterError) as exc:  # PlanError etc. are ValueErrors
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        console.print(f"[red]error:[/] {markup_escape(message)}", highlight=False)
        return 2
    print_plan(console, plan, path)
    if plan.predicted.goodput_rps == 0:
        console.print("[yellow]warning:[/] no request met the SLO in the prediction run; loosen --slo, lower "
                      "--rate or raise --budget")
    return 0


PROFILE_EXAMPLES = """examples:
  tierserve profile                                   # start a local cluster, profile it, write profiles/
  tierserve profile --url http://127.0.0.1:8000 --out profiles/cpu.json
  tierserve profile --repeats 1 --prompt-lengths 64,512 --decode-batches 1,8   # a quick look
  tierserve profile --kv-handoff-url http://127.0.0.1:8100   # + the KV hand-off of an E/P/D cluster there
"""


def parse_counts(text: str, flag: str) -> tuple[int, ...]:
    """"1,2,4" -> (1, 2, 4): positive integers, at least one."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be a comma list of positive integers (e.g. 1,2,4), got {text!r}")
    return values


def add_profile_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `profile` on the `tierserve` command's subparsers."""
    p = subparsers.add_parser("profile", help="measure service times on the workers; write a Profile JSON",
                              description="Measure a model's service times on one encode and one combined worker\n"
                              "(HAS stage 1): encode seconds per batch size (B doubles until throughput\n"
                              "saturates: C_E), prefill seconds per prompt length, decode step seconds per\n"
                              "(batch, context), and the serving stack's overheads around them. Writes the\n"
                              "Profile JSON the performance model and simulator read.",
                              epilog=PROFILE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="coordinator of a running cluster (default: start a local one)")
    p.add_argument("--out", help="file to write (default: profiles/<tier>-<model>.json)")
    p.add_argument("--tier", help="catalog tier the workers run on (default: what the workers report)")
    p.add_argument("--admin-token", help="the coordinator's --admin-token, if it has one")
    p.add_argument("--kv-handoff-url", metavar="URL",
                   help="coordinator of a running cluster with a prefill and a decode worker (e.g. `tierserve up "
                        "--llm prefill,decode`): its KV hand-off (first token -> decode worker admitted) is timed at "
                        "idle and written as the profile's kv_hop_s, which the simulator reads for P -> D hand-offs "
                        "(default: not measured; they take the embeddings' hop)")
    local = p.add_argument_group("local cluster (without --url)")
    local.add_argument("--model", help="checkpoint dir (default: the tiny LLaVA)")
    local.add_argument("--threads", type=int, default=1, help="torch threads per worker (default: %(default)s)")
    local.add_argument("--no-pin-cores", action="store_true",
                       help="let the workers float over all cores (default: one core each)")
    m = p.add_argument_group("measurements")
    m.add_argument("--max-encode-batch", type=int, default=64, help="largest B while doubling (default: %(default)s)")
    m.add_argument("--prompt-lengths", default="32,128,512,1024,2000",
                   help="prefill prompt tokens (default: %(default)s)")
    m.add_argument("--decode-batches", default="1,2,4,8,16,32", help="decode burst sizes (default: %(default)s)")
    m.add_argument("--decode-prompts", default="32,512",
                   help="prompt tokens per decode sequence (default: %(default)s)")
    m.add_argument("--output-tokens", type=int, default=32, help="tokens per decode request (default: %(default)s)")
    m.add_argument("--repeats", type=int, default=3, help="measurements per point (default: %(default)s)")
    m.add_argument("--max-prompt-tokens", type=int, default=2040,
                   help="the model's context - 1 (default: %(default)s, the tiny LLaVA)")
    m.add_argument("--step-token-budget", type=int, default=4096,
                   help="the LLM worker's --max-num-batched-tokens (default: %(default)s)")
    return p


def _profile_settings(a: argparse.Namespace):
    from coordinator.planner.profiling import ProfileSettings

    for flag in ("threads", "max_encode_batch", "output_tokens", "repeats"):
        if getattr(a, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(a, flag)}")
    if a.output_tokens < 2:
        raise ValueError(f"--output-tokens must be at least 2 (a decode step needs a second token), "
                         f"got {a.output_tokens}")
    too_long = [n for n in parse_counts(a.prompt_lengths, "--prompt-lengths") if n > a.max_prompt_tokens]
    if too_long:
        raise ValueError(f"--prompt-lengths {too_long} exceed --max-prompt-tokens {a.max_prompt_tokens} (the "
                         f"model's context - 1); drop them or raise --max-prompt-tokens")
    return ProfileSettings(
        max_encode_batch=a.max_encode_batch, prompt_lengths=parse_counts(a.prompt_lengths, "--prompt-lengths"),
        decode_batches=parse_counts(a.decode_batches, "--decode-batches"),
        decode_prompts=parse_counts(a.decode_prompts, "--decode-prompts"), decode_output_tokens=a.output_tokens,
        repeats=a.repeats, max_prompt_tokens=a.max_prompt_tokens, gate_prompt_tokens=min(2000, a.max_prompt_tokens),
        step_token_budget=a.step_token_budget)


def run_profile(a: argparse.Namespace) -> int:
    """Profile, print, write; 0 on success, 2 on bad input or an unreachable/unsuitable cluster."""
    import asyncio
    import contextlib
    import sys
    from pathlib import Path

    from pydantic import ValidationError
    from rich.console import Console

    from coordinator.launcher import ClusterError
    from coordinator.planner.live_http import LiveClusterError
    from coordinator.redis_server import RedisNotFound

    console = Console()
    try:
        from coordinator.planner.catalog import load_catalog
        from coordinator.planner.profile_report import print_profile, profile_progress
        from coordinator.planner.profiling import planned_measurements, profile_cluster

        settings = _profile_settings(a)
        if a.tier:
            load_catalog().resolve(a.tier)
        command = "tierserve profile " + " ".join(sys.argv[2:])
        kv_hop = None
        if a.kv_handoff_url:  # first: a cluster that cannot hand off is refused before the long run
            from coordinator.planner.profiling_handoff import measure_kv_hop, with_kv_hop

            with console.status(f"timing the KV hand-off on {a.kv_handoff_url}"):
                kv_hop, _ = asyncio.run(measure_kv_hop(a.kv_handoff_url, admin_token=a.admin_token))
        with contextlib.ExitStack() as stack:
            url, pids = (a.url, ()) if a.url else _start_local(a, console, stack)
            with profile_progress(console, planned_measurements(settings, bool(pids))) as tick:
                outcome = asyncio.run(profile_cluster(url, settings, a.tier, a.admin_token, command, tick, pids))
        if kv_hop is not None:
            outcome.profile = with_kv_hop(outcome.profile, kv_hop)
        p = outcome.profile
        path = Path(a.out or f"profiles/{p.tier}-{Path(p.model).name}.json")
        p.save(path)
    except (ValueError, ValidationError, KeyError, LiveClusterError, ClusterError, RedisNotFound, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        console.print(f"[red]error:[/] {message}", highlight=False)
        return 2
    print_profile(console, outcome, path)
    return 0


def _start_local(a: argparse.Namespace, console, stack) -> tuple[str, tuple[int, ...]]:
    """One encode + one combined worker, each pinned to a core, stopped when `stack` closes; returns the
    URL and the pids of the serving stack beside the workers (coordinator, Redis), whose CPU is measured."""
    from pathlib import Path

    from coordinator.launcher import ClusterSpec, LocalCluster
    from coordinator.protocol.models import DEFAULT_MODEL_DIR
    from coordinator.redis_server import free_port

    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], model_dir=Path(a.model or DEFAULT_MODEL_DIR),
                       port=free_port(), threads=a.threads, pin_cores=not a.no_pin_cores)
    cluster = LocalCluster(spec)
    with console.status("starting a local cluster: redis, coordinator, 1 encode + 1 combined worker..."):
        stack.enter_context(cluster)
    console.print(f"local cluster at {cluster.url} (logs: {cluster.log_dir})")
    return cluster.url, stack_pids(cluster)


def stack_pids(cluster) -> tuple[int, ...]:
    """The local cluster's coordinator and private Redis processes (not the workers)."""
    pids = [cluster.procs["coordinator"].pid]
    if cluster.redis is not None:
        pids.append(cluster.redis.proc.pid)
    return tuple(pids)
