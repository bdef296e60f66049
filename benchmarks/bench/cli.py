"""`tierserve bench` (= `python -m benchmarks.bench`): goodput and cost per goodput of OpenAI-compatible
chat servers, tierserve configurations side by side, under one seeded multimodal workload.

Requests stream (TTFT from the first content token, TPOT = (E2E - TTFT)/(output tokens - 1)); a request
is good when it meets every --goodput target; goodput = good requests / wall time of the cell. Every
(system, rate) cell replays the same requests at the same (rate-scaled) offsets, one cell at a time.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from benchmarks.bench import dataset as ds
from benchmarks.bench import workload as wl
from benchmarks.bench.args import build_parser
from benchmarks.bench.client import ClientOptions
from benchmarks.bench.cost import CostError, resolve_costs
from benchmarks.bench.presets import PresetError, parse_presets
from benchmarks.bench.report import LiveObserver, add_ratios, results_json, table, table_text, write_json
from benchmarks.bench.sim_target import SimTarget
from benchmarks.bench.slo import SLOError, parse_goodput
from benchmarks.bench.sweep import Plan, System, rate_label, run
from benchmarks.bench.targets import LocalOptions, Target, TargetError, local_spec, parse_target

USER_ERRORS = (wl.WorkloadError, ds.DatasetError, SLOError, CostError, PresetError, TargetError)


def _rates(a: argparse.Namespace) -> list[float]:
    raw = a.sweep_rate if a.sweep_rate is not None else a.request_rate
    rates = []
    for item in filter(None, (p.strip() for p in raw.split(","))):
        if item == "trace":
            if a.dataset is None or a.sweep_rate is not None:
                raise wl.WorkloadError("--request-rate trace replays a --dataset's timestamps and cannot be swept")
            return [math.nan]
        try:
            rate = float(item)
        except ValueError:
            raise wl.WorkloadError(f"rate {item!r} is not a number (req/s) or inf") from None
        if not rate > 0:
            raise wl.WorkloadError(f"rates must be > 0 req/s (or inf), got {item}")
        rates.append(rate)
    if not rates or len(set(rates)) != len(rates):
        raise wl.WorkloadError(f"give distinct rates, e.g. --sweep-rate 1,2,4 (got {raw!r})")
    return rates


def _systems(a: argparse.Namespace) -> list[System]:
    targets = [_with_plan(parse_target(t), a.plan) for t in (a.target or ["http://127.0.0.1:8000"])]
    if a.plan is not None and not any(t.kind == "sim" and t.plan == a.plan for t in targets):
        raise TargetError("--plan is read by --target sim only")
    presets = parse_presets(a.preset) if a.preset else []
    if presets:
        systems = [System(p.name if len(targets) == 1 else f"{t.label}/{p.name}", t, p) for t in targets for p in presets]
    else:
        systems = [System(t.label, t, None) for t in targets]
    labels = [s.label for s in systems]
    if len(set(labels)) != len(labels):
        raise TargetError(f"two systems share a name ({labels}); name targets with NAME=URL")
    return systems


def _with_plan(t: Target, plan: Path | None) -> Target:
    if t.kind != "sim" or t.plan is not None:
        return t
    if plan is None:
        raise TargetError("--target sim needs a plan file: --target sim --plan PLAN.yaml (or --target sim:PLAN.yaml); "
                          "write one with `tierserve plan`")
    return Target(label=t.label, kind="sim", plan=plan)


def _count(a: argparse.Namespace, rates: list[float], file_len: int | None) -> int:
    """How many requests to build: --num-requests, else enough to fill --duration at the highest rate."""
    if a.num_requests is not None and a.num_requests < 1:
        raise wl.WorkloadError("--num-requests must be >= 1")
    if a.duration is None:
        return a.num_requests or file_len or 100
    if not a.duration > 0:
        raise wl.WorkloadError("--duration must be > 0 seconds")
    if any(not math.isfinite(r) for r in rates):
        raise wl.WorkloadError("--duration needs finite rates (with inf or trace, give --num-requests)")
    return a.num_requests or int(max(rates) * a.duration * 1.5) + 20


def _gaps(n: int, burstiness: float, seed: int, need: float | None) -> np.ndarray:
    """Unit-rate gaps, extended until they span `need` unit-time (so --duration is never cut short)."""
    rng = np.random.default_rng([seed, 0])
    gaps = wl.unit_gaps(n, burstiness, rng)
    while need is not None and gaps.sum() < need:
        gaps = np.concatenate([gaps, wl.unit_gaps(max(16, n // 2), burstiness, rng)])
    return gaps


RATE_SEED_STEP = 7919
"""The n-th rate's requests are synthesized from seed + n * this (the first rate's from the seed itself)."""


def _check_numbers(a: argparse.Namespace) -> None:
    checks = (("--max-concurrency", a.max_concurrency, a.max_concurrency is None or a.max_concurrency >= 1, ">= 1"),
              ("--timeout", a.timeout, 0 < a.timeout < math.inf, "a number of seconds > 0"),
              ("--warmup", a.warmup, a.warmup >= 0, ">= 0"),
              ("--audio-seconds", a.audio_seconds, 0 < a.audio_seconds < math.inf, "a number of seconds > 0"),
              ("--video-frames", a.video_frames, a.video_frames >= 1, "a whole number >= 1"),
              ("--local-encode", a.local_encode, a.local_encode >= 1, ">= 1"),
              ("--local-threads", a.local_threads, a.local_threads >= 1, ">= 1"))
    for flag, value, ok, want in checks:
        if not ok:
            raise wl.WorkloadError(f"{flag} must be {want}, got {value:g}")


def build_plan(a: argparse.Namespace) -> Plan:
    _check_numbers(a)
    slo = parse_goodput(a.goodput) if a.goodput else None
    rates = _rates(a)
    systems = _systems(a)
    costs = resolve_costs([s.label for s in systems], a.cost_per_hour, a.gpus, a.catalog)
    sims = {s.target: SimTarget(s.target.plan, a.catalog) for s in systems if s.target.kind == "sim" and s.target.plan}
    for s in systems:
        if s.target in sims and s.label not in costs:
            costs[s.label] = sims[s.target].cost()  # the plan's own prices
    outputs = wl.Length.parse(a.output_tokens, "--output-tokens")
    file_specs = ds.load_dataset(a.dataset) if a.dataset else None
    n = _count(a, rates, len(file_specs) if file_specs else None)
    # --duration alone: enough gaps to span it at the highest rate; with --num-requests that count rules
    need = max(rates) * a.duration if a.duration is not None and a.num_requests is None else None
    gaps = _gaps(n, a.burstiness, a.seed, need)
    n = max(n, len(gaps))
    if file_specs is not None:
        if math.isnan(rates[0]) and any(s.timestamp is None for s in file_specs):
            raise ds.DatasetError(f"--request-rate trace: every line of {a.dataset} needs a \"timestamp\"")
        if math.isnan(rates[0]) and n > len(file_specs):
            raise ds.DatasetError(f"--request-rate trace replays {len(file_specs)} lines; --num-requests {n} exceeds them")
        rate_specs = {}  # a file's requests are what they are: every cell sends them (see --dataset)
        specs = ds.take(file_specs, n, outputs, a.seed)
        warm = specs[-a.warmup:] if a.warmup else []  # the file has no spare requests; the last are reused least soon
    else:
        mix = wl.MixConfig(modalities=wl.parse_modalities(a.modality),
                           images_per_request=wl.Length.parse(a.images_per_request, "--images-per-request", floor=0),
                           image_sizes=wl.parse_sizes(a.image_size), output_tokens=outputs,
                           prompt_tokens=wl.Length.parse(a.prompt_tokens, "--prompt-tokens"), audio_seconds=a.audio_seconds,
                           video_frames=a.video_frames)
        specs = wl.synthesize(n, mix, a.seed)
        # Each rate its own requests, and the warm-ups theirs: a server caching prefixes or encoder outputs by
        # image must not see a cell's requests before that cell.
        rate_specs = {rate: specs if i == 0 else wl.synthesize(n, mix, a.seed + RATE_SEED_STEP * i)
                      for i, rate in enumerate(r for r in rates if not math.isnan(r))}
        warm = wl.synthesize(a.warmup, mix, a.seed + 1_000_003)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    return Plan(systems=systems, rates=rates, specs=specs, gaps=gaps[:n], slo=slo, costs=costs, model=a.model,
                client=ClientOptions(model=a.model or "", ignore_eos=not a.no_ignore_eos, timeout_s=a.timeout, headers=headers),
                max_concurrency=a.max_concurrency, duration_s=a.duration, warmup_specs=warm, sims=sims,
                local=LocalOptions(model=a.local_model, encode_workers=a.local_encode, pin_cores=not a.local_no_pin,
                                   threads=a.local_threads),
                admin_headers={"Authorization": f"Bearer {a.admin_token}"} if a.admin_token else {},
                interleave=a.interleave, rate_specs=rate_specs)


def _context(a: argparse.Namespace, argv: list[str], plan: Plan, load_at_start: list[float]) -> dict:
    workload = {"rates": [rate_label(r) for r in plan.rates], "burstiness": a.burstiness,
                "max_concurrency": a.max_concurrency, "requests_built": len(plan.specs), "duration_s": a.duration,
                "warmup_requests": a.warmup, "ignore_eos": not a.no_ignore_eos, "interleave": a.interleave}
    if a.dataset:
        workload["dataset"] = str(a.dataset)
    else:
        workload["mix"] = {"modality": a.modality, "images_per_request": a.images_per_request, "image_size": a.image_size,
                           "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens}
    systems = []
    for s in plan.systems:
        where = s.target.url or (f"sim:{s.target.plan}" if s.target.plan else s.target.kind)
        entry = {"label": s.label, "target": where, "preset": s.preset.name if s.preset else None,
                 "policy": s.preset.policy if s.preset else None}
        if s.label in plan.costs:
            entry["cost"] = plan.costs[s.label].model_dump()
        if s.target.kind == "local":
            spec = local_spec([x.preset for x in plan.systems if x.target == s.target and x.preset], plan.local)
            entry["local_cluster"] = {"encode_workers": spec.encode_workers, "llm_roles": spec.llm_roles,
                                      "local_prefill": spec.local_prefill, "steal": spec.steal, "pin_cores": spec.pin_cores,
                                      "threads": spec.threads, "model": str(spec.model_dir)}
        systems.append(entry)
    return {"tool": "tierserve bench", "command": "python -m benchmarks.bench " + shlex.join(argv),
            "load_average_at_start": load_at_start,  # 1/5/15 min: others' work on a shared host skews cells
            "seed": a.seed, "slo": plan.slo.model_dump() if plan.slo else None, "workload": workload, "systems": systems}


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise wl.WorkloadError(f"--out: cannot write results to {out}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = build_parser(__doc__ or "").parse_args(argv)
    console = Console(stderr=a.quiet)
    if not console.is_terminal:  # a pipe or a log file: 80 columns would fold every table cell
        console.width = 200
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    try:
        plan = build_plan(a)
        _writable(a.out)  # before the run: a long run must not end unable to save its results
        failures: list[str] = []
        with LiveObserver(console, a.quiet) as observer:
            cells = run(plan, observer, failures)
        if failures and not cells:
            raise TargetError(failures[0] if len(failures) == 1 else "; ".join(failures))
    except USER_ERRORS as e:
        console.print(f"[red]error:[/] {escape(str(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]; no results written")
        return 130
    add_ratios(cells)
    title = "tierserve bench" + (f" (SLO: {plan.slo.label()})" if plan.slo else " (no --goodput: goodput = completed)")
    t = table(cells, title)
    doc = results_json(cells, _context(a, argv, plan, load_at_start) | {"failed_targets": failures})
    out: Path = a.out
    write_json(out / "bench.json", doc)
    (out / "table.txt").write_text(f"$ {doc['command']}\n# git {doc['git_revision']}, {doc['date']}\n\n{table_text(t)}")
    written = [out / "bench.json", out / "table.txt"]
    if not a.no_plots:
        from benchmarks.bench.plots import write_plots

        written += write_plots(cells, plan.slo, out)
    if not a.quiet:
        console.print(t)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)
    if not any(c.summary["completed"] for c in cells):
        console.print("[red]error:[/] no request completed in any cell; see the errors column")
        return 1
    if failures:
        console.print(f"[red]error:[/] {len(failures)} target(s) failed part-way ({escape('; '.join(failures))}); "
                      "the cells measured before are written", highlight=False)
        return 1
    return 0
