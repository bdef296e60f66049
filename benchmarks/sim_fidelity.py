"""Simulator fidelity: the local CPU cluster vs the planner's simulator on the same workload.

Brings up the local cluster (real workers, the tiny LLaVA: 1 encode + 1 combined worker, each pinned to
a core, pass-through batching). Per arrival rate: profiles it (the profiling module, `tierserve
profile`'s code), replays an open-loop Poisson workload through it twice (coordinator/planner/replay.py;
the two live runs' difference is the noise floor of the shared host), and simulates the same deployment
(`E@cpu, P+D@cpu`) on the same requests (same count and seed: the same arrival times and prompt/output
lengths). Reports the simulator's relative error on goodput, P50 TTFT and mean TPOT against the mean of
the two live runs, for four readings of the profile:
  compute      the workers' compute points alone (the "before");
  overheads    + the serving stack's measured overheads (per batch/step, hops, request latency): what
               PerfModel reads from a profile by default (for GPU clusters, whose stack has its own cores);
  contention   + the stack's CPU spread over the 2 shared cores, stretching every time (PerfModel
               host_contention="uniform");
  encode_core  + the stack's CPU on the encode worker's core, stretching encode and the stack's own
               latency, not the LLM's steps (host_contention="encode_core"): the model of this cluster,
               where the LLM worker keeps its core busy and the scheduler puts the stack beside the
               encoder. The per-stage TTFT means (ttft_stages.py, live from the coordinator's per-hop
               marks) are what told the readings apart: encode and the stack's hops grow with load.
Each rate is profiled right before and right after its replays, and the two pooled (the median of
every point), because the host's speed drifts within minutes (on the 2026-11-29 runs two profiles 4
minutes apart put decode at 3395 and 2690 tokens/s). Each reading is also simulated with all rates'
profiles pooled ("sim_pooled"). The simulated engine pads its batches as llm_node's does
(EngineLimits.pad_to_longest). Writes JSON with the command and the load average around every replay
(absolute times hold only for this host and its load then).

    python -m benchmarks.sim_fidelity --rates 2 5 8 --requests 150

Offline, from a saved result (no cluster: the same requests are regenerated from the saved count and
seed, the saved profiles and live figures are reused, only the simulator runs):

    python -m benchmarks.sim_fidelity --resimulate benchmarks/results/sim_fidelity.json [--out FILE]

Other layouts (E+P+D with KV hand-off, a co-located prefill worker at s = 0.5, work stealing, adaptive
micro-batching; sim_fidelity_layouts.py), each with its own SLO and rates:

    python -m benchmarks.sim_fidelity --layouts epd colocated_prefill stealing adaptive --requests 120
    python -m benchmarks.sim_fidelity --resimulate benchmarks/results/sim_fidelity_layouts.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment, EngineLimits
from coordinator.planner.durations import UNIT_HELP, DurationError, duration_arg, parse_duration_s
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import Profile, pool_profiles
from coordinator.planner.profiling import (
    ProfileSettings,
    planned_measurements,
    profile_cluster,
)
from coordinator.planner.replay import HttpReplayer, summarize_replay
from coordinator.planner.sim import SimResult, Simulator
from coordinator.planner.sim_noise import HostNoise
from coordinator.planner.ttft_stages import STAGES, live_stages, sim_stages
from coordinator.planner.workload import ArrivalProcess, RequestClass, Uniform, Workload
from coordinator.policies.base import BatchPolicyConfig
from coordinator.redis_server import free_port

DEPLOYMENT = "E@cpu, P+D@cpu"
METRICS = {"goodput_rps": "goodput", "ttft_p50_s": "P50 TTFT", "tpot_mean_s": "mean TPOT",
           "goodput_tight_rps": "goodput, tight SLO"}
"""Compared metrics. Under the main SLO (~4x the idle TTFT/TPOT) nearly every request is good below
saturation, so goodput there mostly checks throughput; the tight SLO (~1.5x) makes it depend on the
latency distributions."""


def workload(rate: float, tokens_per_image: int) -> Workload:
    """One image per request; text and output lengths vary so steps mix prefills and decodes."""
    return Workload(arrivals=ArrivalProcess(rate=rate), mix=[RequestClass(
        modality="image", tokens_per_item=tokens_per_image, prompt_tokens=Uniform(low=16, high=128),
        output_tokens=Uniform(low=16, high=48))])


VARIANTS = ("compute", "overheads", "contention", "encode_core")


def simulate(profile: Profile, requests, variant: str, padded: bool = True) -> SimResult:
    """The simulator on one reading of the profile (VARIANTS); `padded`: the engine pads its batches to
    the longest sequence, as llm_node's reference engine does (False: the simulator before that)."""
    arch = get_arch(profile.model)
    contention = {"contention": "uniform", "encode_core": "encode_core"}.get(variant, "none")
    perf = PerfModel(load_catalog(), arch, [profile], overheads=variant != "compute", host_contention=contention)
    dep = Deployment.parse(DEPLOYMENT, batch=BatchPolicyConfig(name="pass_through"),
                           engine=EngineLimits(max_num_seqs=32, max_num_batched_tokens=4096, pad_to_longest=padded))
    sim = Simulator(dep, perf, kv_bytes_per_token=arch.kv_bytes_per_token(),
                    embedding_bytes_per_token=arch.embedding_bytes(1))
    return sim.run(requests)


def simulate_cell(cell: dict, profile: Profile, requests: int, seed: int, slos: tuple[SLO, SLO],
                  padded: bool = True) -> tuple[dict, dict]:
    """(sim figures, errors against the cell's live mean) per variant, for one rate and one profile."""
    reqs = workload(cell["rate"], profile.encode["image"].tokens_per_item).generate(requests, seed=seed)
    sims = {}
    for v in VARIANTS:
        result = simulate(profile, reqs, v, padded)
        sims[v] = figures(*(result.summary(slo) for slo in slos)) | {"ttft_stages": rounded(sim_stages(result.records))}
    return sims, {v: relative(sims[v], cell["live_mean"]) for v in VARIANTS}


def simulate_cells(cells: list[dict], requests: int, seed: int, slos: tuple[SLO, SLO], padded: bool = True) -> None:
    """Fill every cell's sim/error (its own profile) and sim_pooled/error_pooled (all cells' profiles
    pooled), in place."""
    profiles = [Profile.model_validate(c["profile"]) for c in cells]
    pooled = pool_profiles(profiles) if len(profiles) > 1 else None
    for cell, profile in zip(cells, profiles):
        cell["sim"], cell["error"] = simulate_cell(cell, profile, requests, seed, slos, padded)
        if pooled is not None:
            cell["sim_pooled"], cell["error_pooled"] = simulate_cell(cell, pooled, requests, seed, slos, padded)
        else:
            cell.pop("sim_pooled", None)
            cell.pop("error_pooled", None)


def figures(s: Summary, tight: Summary) -> dict:
    return {"goodput_rps": round(s.goodput_rps, 4), "throughput_rps": round(s.throughput_rps, 4),
            "slo_attainment": round(s.slo_attainment, 4), "ttft_p50_s": round(s.ttft_p50_s, 5),
            "ttft_p99_s": round(s.ttft_p99_s, 5), "tpot_mean_s": round(s.tpot_mean_s, 6),
            "goodput_tight_rps": round(tight.goodput_rps, 4), "slo_attainment_tight": round(tight.slo_attainment, 4),
            "duration_s": round(s.duration_s, 3)}


def rounded(stages: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 5) for k, v in stages.items()}


def relative(value: dict, ref: dict) -> dict[str, float | None]:
    """(value - ref) / ref per metric; None where ref is 0."""
    return {k: round((value[k] - ref[k]) / ref[k], 4) if ref[k] else None for k in METRICS}


def replay(replayer: HttpReplayer, requests, slos: tuple[SLO, SLO], progress: Progress, label: str) -> dict:
    task = progress.add_task(label, total=len(requests))
    replayer.on_done = lambda _r: progress.advance(task)
    load_before = os.getloadavg()[0]
    records, mean_batch = replayer.run(requests)
    judged = [summarize_replay(records, slo, mean_batch) for slo in slos]
    return {"figures": figures(*judged), "ttft_stages": rounded(live_stages(records)),
            "failed": sum(not r.ok for r in records),
            "prompt_token_mismatches": sum(r.ok and r.prompt_tokens != r.request.prompt_tokens for r in records),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def one_rate(cluster: LocalCluster, rate: float, a: argparse.Namespace, slos: tuple[SLO, SLO], command: str,
             progress: Progress) -> dict:
    settings = ProfileSettings(repeats=a.repeats)
    pids = [cluster.procs["coordinator"].pid] + ([cluster.redis.proc.pid] if cluster.redis else [])

    def take(when: str):
        task = progress.add_task(f"profile {when} {rate:g} req/s", total=planned_measurements(settings, True))
        return asyncio.run(profile_cluster(cluster.url, settings, source=command, stack_pids=pids,
                                           tick=lambda n: progress.advance(task, n)))

    before = take("before")
    requests = workload(rate, before.profile.encode["image"].tokens_per_item).generate(a.requests, seed=a.seed)
    replayer = HttpReplayer(cluster.url)
    runs = [replay(replayer, requests, slos, progress, f"{rate:g} req/s, live run {i + 1}") for i in range(2)]
    after = take("after") if a.bracket else None
    # The host's speed drifts within minutes: a profile before and one after the live runs, pooled,
    # describe the machine the runs saw better than either alone.
    bracket = [before.profile] + ([after.profile] if after else [])
    profile = pool_profiles(bracket, source=before.profile.source) if after else before.profile
    live = {k: (runs[0]["figures"][k] + runs[1]["figures"][k]) / 2 for k in METRICS}
    stages = [r["ttft_stages"] for r in runs if r["ttft_stages"]]
    live_stages_mean = {k: round(sum(st[k] for st in stages) / len(stages), 5) for k in STAGES} if stages else {}
    return {"rate": rate, "live_runs": runs, "live_mean": live, "live_ttft_stages": live_stages_mean,
            "noise_floor": {k: round(abs(runs[0]["figures"][k] - runs[1]["figures"][k]) / live[k], 4) if live[k] else None
                            for k in METRICS},
            "profile_notes": before.notes + (after.notes if after else []), "profile": profile.model_dump(mode="json"),
            "profiles_bracket": [p.model_dump(mode="json") for p in bracket]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_fidelity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 5.0, 8.0], help="arrival rates, req/s")
    p.add_argument("--requests", type=int, default=150, help="requests per rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    p.add_argument("--slo-ttft", type=duration_arg("--slo-ttft"), default="200ms", metavar="TIME",
                   help=f"TTFT SLO, {UNIT_HELP} (default: %(default)s)")
    p.add_argument("--slo-tpot", type=duration_arg("--slo-tpot"), default="15ms", metavar="TIME",
                   help="TPOT SLO, with its unit (default: %(default)s)")
    p.add_argument("--tight-slo-ttft", type=duration_arg("--tight-slo-ttft"), default="75ms", metavar="TIME",
                   help="tight TTFT SLO, with its unit (default: %(default)s)")
    p.add_argument("--tight-slo-tpot", type=duration_arg("--tight-slo-tpot"), default="7.5ms", metavar="TIME",
                   help="tight TPOT SLO, with its unit (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="profiling repeats per point (default: %(default)s)")
    p.add_argument("--no-pin-cores", action="store_true", help="let the workers float over all cores")
    p.add_argument("--no-bracket", dest="bracket", action="store_false",
                   help="profile only before each rate's live runs (default: before and after, pooled)")
    p.add_argument("--no-padding", action="store_true",
                   help="simulate an engine that does not pad its batches (the simulator before pad_to_longest)")
    p.add_argument("--resimulate", type=Path, metavar="RESULT_JSON",
                   help="no cluster: re-run only the simulator on a saved result's profiles, requests and live figures")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT", default=None,
                   help="run these layouts instead (sim_fidelity_layouts.LAYOUTS: combined, epd, colocated_prefill, "
                        "stealing, adaptive), each at its own rates unless --rates is given")
    p.add_argument("--slo", nargs="+", default=[], metavar="LAYOUT=TTFT,TPOT",
                   help="with --layouts or --resimulate of a layouts result: judge LAYOUT under this SLO instead, "
                        "both times with their units (e.g. epd=40ms,8.5ms)")
    p.add_argument("--core-sharing", type=float, default=None, metavar="SHARE",
                   help="with --layouts or --resimulate of a layouts result: the share of a core two or more busy "
                        "processes time-slicing it get in all, on every time-sliced core (Simulator(core_sharing=...); default: "
                        "sim_fidelity_layouts.CORE_SHARING, and the pair measured for a layout's shared core where there is "
                        "one, by benchmarks/core_sharing.py; 1: no loss)")
    p.add_argument("--host-noise-sigma", type=float, default=None, metavar="SIGMA",
                   help="with --layouts or --resimulate of a layouts result: simulate the host's speed varying, a "
                        "lognormal factor of median 1 and this log-sd on every encode, prefill and decode step "
                        "(coordinator/planner/sim_noise.py; 0.25 fitted here); needs --host-noise-period-ms")
    p.add_argument("--host-noise-period-ms", type=float, default=None, metavar="MS",
                   help="milliseconds of simulated time one host-speed factor lasts (50 fitted here)")
    p.add_argument("--host-noise-seed", type=int, default=0,
                   help="seed of the host-speed factors (default: %(default)s); one seed is one realisation of the "
                        "noise, and the figures move with it: compare several")
    p.add_argument("--noise-draws", type=int, default=None, metavar="N",
                   help="with --layouts or --resimulate of a layouts result: draws of the host noise read from each "
                        "live run that its simulation averages (default: sim_fidelity_layouts.NOISE_DRAWS, 3; 1: one "
                        "draw, as every table before benchmarks/results/sim_fidelity_s31 was judged)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON to write (default: benchmarks/results/sim_fidelity.json for a live run; "
                        "nothing for --resimulate)")
    a = p.parse_args(argv)
    command = " ".join(["python -m benchmarks.sim_fidelity", *(sys.argv[1:] if argv is None else argv)])
    console = Console(width=None if sys.stdout.isatty() else 140)  # a piped table keeps one line per row
    rates_given = any(x == "--rates" or x.startswith("--rates=") for x in (sys.argv[1:] if argv is None else argv))
    if a.layouts is not None or (a.resimulate is not None and "layouts" in json.loads(a.resimulate.read_text())):
        return layouts_main(a, p, command, console, rates_given)
    if (a.host_noise_sigma is not None or a.host_noise_period_ms is not None or a.core_sharing is not None
            or a.noise_draws is not None):
        p.error("--host-noise-sigma / --host-noise-period-ms / --core-sharing / --noise-draws apply to --layouts runs "
                "(or a re-simulation of one)")
    if a.resimulate is not None:
        return resimulate(a.resimulate, a.out, not a.no_padding, command, console)
    if a.requests < 2 or a.repeats < 1 or any(r <= 0 for r in a.rates):
        p.error("--requests must be >= 2, --repeats >= 1 and every rate > 0")
    out = a.out or Path("benchmarks/results/sim_fidelity.json")
    slo = SLO(ttft_s=a.slo_ttft, tpot_s=a.slo_tpot)
    slos = (slo, SLO(ttft_s=a.tight_slo_ttft, tpot_s=a.tight_slo_tpot))
    spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=not a.no_pin_cores)
    with LocalCluster(spec) as cluster, Progress(console=console, transient=True) as progress:
        cells = [one_rate(cluster, rate, a, slos, command, progress) for rate in a.rates]
    simulate_cells(cells, a.requests, a.seed, slos, padded=not a.no_padding)
    report = {"command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cores": os.cpu_count(), "note": "shared with other jobs; load averages per replay"},
              "cluster": "1 encode + 1 combined worker, tiny-llava, pass-through batching, "
                         + ("each worker pinned to a core" if not a.no_pin_cores else "workers floating"),
              "deployment_simulated": DEPLOYMENT, "slo": slo.model_dump(), "slo_tight": slos[1].model_dump(),
              "requests_per_rate": a.requests,
              "seed": a.seed, "workload": workload(1.0, 196).model_dump(mode="json")["mix"],
              "variants": {"compute": "the profile's compute points alone (before)",
                           "overheads": "+ measured serving-stack overheads (per batch/step, hops, request latency) "
                                        "(after: PerfModel's default)",
                           "contention": "+ the stack's CPU spread over the host's cores at the offered load, "
                                         "stretching every time (PerfModel(host_contention='uniform'))",
                           "encode_core": "+ the stack's CPU on the encode worker's core, stretching encode and "
                                          "the stack's latency (PerfModel(host_contention='encode_core')): the "
                                          "model of this one-host cluster"},
              "error": "(sim - mean of the two live runs) / that mean; noise_floor = |run1 - run2| / mean",
              "profiles": "sim/error: each rate's own profile (before and after its live runs, pooled unless "
                          "--no-bracket; profiles_bracket keeps both); sim_pooled/error_pooled: the median of all "
                          "rates' profiles (profile.pool_profiles)",
              "engine_padding": not a.no_padding,
              "target": "|error| <= 0.10", "rates": cells}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(console, cells, slo)
    console.print(f"wrote {out}")
    return 0


def layouts_main(a: argparse.Namespace, p: argparse.ArgumentParser, command: str, console: Console,
                 rates_given: bool) -> int:
    """--layouts (live) or --resimulate of a layouts result: sim_fidelity_layouts.py."""
    from benchmarks import sim_fidelity_layouts as lay  # it imports this module

    slos = {}
    for item in a.slo:
        name, _, pair = item.partition("=")
        times = pair.split(",")
        if not name or len(times) != 2:
            p.error(f"--slo {item!r}: expected LAYOUT=TTFT,TPOT with units, e.g. epd=40ms,8.5ms")
        try:
            slos[name] = SLO(ttft_s=parse_duration_s(times[0], f"--slo {name} TTFT", bare=None),
                             tpot_s=parse_duration_s(times[1], f"--slo {name} TPOT", bare=None))
        except DurationError as e:
            p.error(f"{e} (--slo LAYOUT=TTFT,TPOT, e.g. epd=40ms,8.5ms)")
    if a.noise_draws is not None:
        if a.noise_draws < 1:
            p.error(f"--noise-draws must be at least 1, got {a.noise_draws}")
        lay.NOISE_DRAWS = a.noise_draws
    if a.core_sharing is not None:
        if not 0.0 < a.core_sharing <= 1.0:
            p.error(f"--core-sharing must be in (0, 1], got {a.core_sharing}")
        lay.CORE_SHARING, lay.GROUP_SHARING = a.core_sharing, False
    if (a.host_noise_sigma is None) != (a.host_noise_period_ms is None):
        p.error("--host-noise-sigma and --host-noise-period-ms go together (e.g. 0.25 and 50)")
    if a.host_noise_sigma is not None:
        try:
            lay.HOST_NOISE = HostNoise(sigma=a.host_noise_sigma, period_s=a.host_noise_period_ms / 1e3,
                                       seed=a.host_noise_seed)
        except ValueError as e:
            p.error(f"--host-noise-sigma / --host-noise-period-ms: {e}")
    if a.resimulate is not None:
        lay.resimulate(a.resimulate, slos, a.out, command, console)
        return 0
    unknown = sorted(set(a.layouts) - set(lay.LAYOUTS))
    if unknown or a.requests < 2 or a.repeats < 1:
        p.error(f"unknown layouts {unknown} (known: {', '.join(lay.LAYOUTS)}), or --requests < 2 or --repeats < 1")
    out = a.out or Path("benchmarks/results/sim_fidelity_layouts.json")
    lay.run(a.layouts, a.rates if rates_given else None, a.requests, a.seed, a.repeats, out, command, console, slos)
    console.print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def resimulate(path: Path, out: Path | None, padded: bool, command: str, console: Console) -> int:
    """Re-run the simulator on a saved result: its profiles, request count, seed, SLOs and live figures."""
    report = json.loads(path.read_text())
    slo, tight = SLO.model_validate(report["slo"]), SLO.model_validate(report["slo_tight"])
    cells = report["rates"]
    before = {c["rate"]: c.get("error") for c in cells}
    simulate_cells(cells, report["requests_per_rate"], report["seed"], (slo, tight), padded)
    report["resimulated"] = {"command": command, "from": str(path), "saved_error": before,
                             "saved_engine_padding": report.get("engine_padding", False),
                             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    report["engine_padding"] = padded
    print_table(console, cells, slo)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {out}")
    return 0


def print_table(console: Console, cells: list[dict], slo: SLO) -> None:
    """One row per rate and reading: the live means, the noise floor, then each reading's errors."""
    table = Table(title=f"simulator vs live (SLO: TTFT <= {slo.ttft_s}s, TPOT <= {slo.tpot_s}s)")
    for col in ("rate", "row", *METRICS.values()):
        table.add_column(col, justify="right")
    for c in cells:
        live = c["live_mean"]
        table.add_row(f"{c['rate']:g}", "live (mean of 2)", f"{live['goodput_rps']:.2f}/s",
                      f"{live['ttft_p50_s'] * 1e3:.1f} ms", f"{live['tpot_mean_s'] * 1e3:.2f} ms",
                      f"{live['goodput_tight_rps']:.2f}/s")
        table.add_row("", "noise floor (|run 1 - run 2|)", *("n/a" if c["noise_floor"][k] is None
                                                              else f"{c['noise_floor'][k]:.1%}" for k in METRICS))
        pooled = "error_pooled" in c
        for v in VARIANTS:
            table.add_row("", f"error: {v}", *(_pct(c["error"][v][k]) for k in METRICS),
                          end_section=v == VARIANTS[-1] and not pooled)
        for v in VARIANTS if pooled else ():
            table.add_row("", f"error: {v} (pooled profiles)", *(_pct(c["error_pooled"][v][k]) for k in METRICS),
                          end_section=v == VARIANTS[-1])
    console.print(table)
    stage_table(console, cells)


def stage_table(console: Console, cells: list[dict]) -> None:
    """Mean TTFT per stage (ttft_stages.py), live against the encode_core reading of the rate's own profile."""
    if not any(c.get("live_ttft_stages") for c in cells):
        return
    table = Table(title="mean TTFT by stage, ms: live / simulated (encode_core reading, the rate's own profile)")
    for col in ("rate", *STAGES):
        table.add_column(col, justify="right")
    for c in cells:
        live = c.get("live_ttft_stages") or {}
        sim = c["sim"].get("encode_core", {}).get("ttft_stages") or {}
        table.add_row(f"{c['rate']:g}", *(f"{live.get(k, math.nan) * 1e3:.1f} / {sim.get(k, math.nan) * 1e3:.1f}"
                                          for k in STAGES))
    console.print(table)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


if __name__ == "__main__":
    sys.exit(main())
