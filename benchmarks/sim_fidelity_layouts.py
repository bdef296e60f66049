"""Simulator fidelity on more layouts than 1 encode + 1 combined worker (`sim_fidelity --layouts ...`).

Each layout is a live local CPU cluster (tiny-llava, every worker pinned to one of the host's cores)
and the simulated deployment that stands for it, run on the same requests (same count and seed):

  combined           E | P+D, pass-through batching: sim_fidelity's own layout, for reference
  epd                E and P time-slicing core 0, D alone on core 1; every KV cache handed P -> D
  colocated_prefill  E+P on core 0 (encoder and co-located prefill worker, offload share s = 0.5;
                     no SM masks on a CPU: the two processes time-slice), P+D and D on core 1
  stealing           E with a stealing combined worker on core 0 (time sharing through the GPU
                     gate), P+D on core 1; stealing on (WorkStealingConfig defaults)
  adaptive           E | P+D with adaptive micro-batching (B = 8, work-conserving)

Workers that share a core are simulated on a shared core (Simulator(shared_cores=...): k busy
workers each run at 1/k), which is what the host does to them; an E+P node's two workers share its
"GPU" by processor sharing (partition mode "none"). Service times come from measured profiles
(`tierserve profile`'s code) taken on a separate 1 encode + 1 combined profiling cluster (the shape
profiling needs) running beside the layout's cluster, each pinned the same way: one profile before
the first rate and one after every rate, each rate simulated on the two around it, pooled (the
host's speed drifts within minutes). The reading is sim_fidelity's "encode_core" one (measured
overheads; the serving stack's CPU on the encode worker's core).

Per layout and rate: two live runs (their difference is the noise floor of the shared host) against
the simulation, on goodput, P50 TTFT and mean TPOT, under the layout's SLO, chosen tight enough that
attainment lands between 50 % and 95 % at the middle rate so that goodput depends on the latency
distributions. Every live request's times are saved, so the figures can be judged again under
another SLO and re-simulated offline (--resimulate, --slo).

    python -m benchmarks.sim_fidelity --layouts epd colocated_prefill stealing adaptive --requests 120
    python -m benchmarks.sim_fidelity --resimulate benchmarks/results/sim_fidelity_layouts.json [--slo epd=0.1,0.01]
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import httpx
from rich.console import Console
from rich.progress import Progress

from benchmarks.sim_fidelity import rounded, workload
from benchmarks.sim_fidelity_host import CoreSampler, ForeignCPU
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment, EngineLimits
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import Profile, pool_profiles
from coordinator.planner.profiling import ProfileSettings, planned_measurements, profile_cluster
from coordinator.planner.replay import HttpReplayer, ReplayRecord, summarize_replay
from coordinator.planner.sim import SimResult, Simulator
from coordinator.planner.ttft_stages import STAGES, live_stages, sim_stages
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port

METRICS = {"goodput_rps": "goodput", "ttft_p50_s": "P50 TTFT", "tpot_mean_s": "mean TPOT"}
T = TypeVar("T")
ENGINE = EngineLimits(max_num_seqs=32, max_num_batched_tokens=4096, pad_to_longest=True)
"""llm_node's defaults on this model (--max-num-seqs 32, budget max(4096, context)); its engine pads."""
LOAD_REPORT_S = 0.5
"""Live workers report their load with each heartbeat (coordinator/protocol/registry.py: every TTL / 4 =
0.5 s), and the encode worker routes and steals on those reports."""


@dataclass(frozen=True)
class Layout:
    """One live cluster shape and the simulated deployment that stands for it."""

    name: str
    about: str
    deployment: str
    """Deployment.parse spec; node names follow from it ("0-E-cpu", ...)."""
    knobs: dict = field(default_factory=dict)
    """Deployment policy sections (batch, offload, stealing, partition): simulated, and PUT live."""
    llm_roles: tuple[str, ...] = ("combined",)
    local_prefill: bool = False
    steal: bool = False
    shared_cores: tuple[frozenset[str], ...] = ()
    """Simulated nodes whose live workers share a core."""
    pins: tuple[tuple[str, int], ...] = ()
    """Live processes moved to another core after start (process name, core index), where the
    launcher's slot-modulo placement would stack three workers on one core."""
    rates: tuple[float, ...] = (2.0, 5.0, 8.0)
    """Light, medium, near saturation (req/s) of this layout on this host: from probes of each live
    layout at 4, 8 and 12 req/s on 2026-12 (80 requests each; saturation: throughput below the rate or
    TPOT growing without bound): combined > 12, epd ~10, colocated_prefill ~9, stealing ~9 req/s."""
    slo: SLO = SLO(ttft_s=0.075, tpot_s=0.0075)
    """Near the live middle rate's 75th percentiles of TTFT and TPOT in those probes, so that attainment
    there lands between 50 % and 95 %."""

    def deployment_obj(self) -> Deployment:
        return Deployment.parse(self.deployment, engine=ENGINE, **self.knobs)

    def spec(self) -> ClusterSpec:
        return ClusterSpec(encode_workers=1, llm_roles=list(self.llm_roles), local_prefill=self.local_prefill,
                           steal=self.steal, port=free_port(), pin_cores=True, key_prefix=f"tsfid-{self.name}")


LAYOUTS = {l.name: l for l in (
    Layout("combined", "1 encode | 1 combined (sim_fidelity's layout), pass-through", "E@cpu, P+D@cpu",
           {"batch": {"name": "pass_through"}}, rates=(3.0, 7.0, 11.0), slo=SLO(ttft_s=0.1, tpot_s=0.012)),
    Layout("epd", "encode + prefill on core 0, decode on core 1 (KV hand-off P -> D), pass-through",
           "E@cpu, D@cpu, P@cpu", {"batch": {"name": "pass_through"}}, llm_roles=("decode", "prefill"),
           shared_cores=(frozenset({"0-E-cpu", "2-P-cpu"}),), rates=(3.0, 6.0, 9.0),
           slo=SLO(ttft_s=0.12, tpot_s=0.010)),
    Layout("colocated_prefill", "encode + co-located prefill (s = 0.5) on core 0, combined + decode on core 1",
           "E+P@cpu, P+D@cpu, D@cpu",
           {"batch": {"name": "pass_through"}, "offload": {"s": 0.5}, "partition": {"mode": "none"}},
           llm_roles=("combined", "decode"), local_prefill=True, shared_cores=(frozenset({"1-P+D-cpu", "2-D-cpu"}),),
           pins=(("llm-1-decode", 1),), rates=(2.5, 5.0, 7.5), slo=SLO(ttft_s=0.2, tpot_s=0.018)),
    Layout("stealing", "encode + stealing combined worker on core 0, combined on core 1, stealing on",
           "E@cpu, P+D@cpu", {"batch": {"name": "pass_through"}, "stealing": {"enabled": True}}, steal=True,
           rates=(3.0, 6.0, 9.0), slo=SLO(ttft_s=0.15, tpot_s=0.016)),
    Layout("adaptive", "1 encode | 1 combined, adaptive micro-batching (B = 8, work-conserving)", "E@cpu, P+D@cpu",
           {"batch": {"name": "adaptive", "max_batch": 8, "work_conserving": True}},
           rates=(3.0, 7.0, 11.0), slo=SLO(ttft_s=0.1, tpot_s=0.012)),
)}


# --- simulation -----------------------------------------------------------------------------------

def simulate(layout: Layout, profile: Profile, requests: list[SimRequest]) -> SimResult:
    arch = get_arch(profile.model)
    perf = PerfModel(load_catalog(), arch, [profile], overheads=True, host_contention="encode_core")
    sim = Simulator(layout.deployment_obj(), perf, kv_bytes_per_token=arch.kv_bytes_per_token(),
                    embedding_bytes_per_token=arch.embedding_bytes(1), shared_cores=layout.shared_cores,
                    load_report_s=LOAD_REPORT_S)
    return sim.run(requests)


def figures(s: Summary) -> dict:
    return {"goodput_rps": round(s.goodput_rps, 4), "throughput_rps": round(s.throughput_rps, 4),
            "slo_attainment": round(s.slo_attainment, 4), "ttft_p50_s": round(s.ttft_p50_s, 5),
            "ttft_p99_s": round(s.ttft_p99_s, 5), "ttft_mean_s": round(s.ttft_mean_s, 5),
            "tpot_mean_s": round(s.tpot_mean_s, 6), "duration_s": round(s.duration_s, 3)}


def relative(value: dict, ref: dict) -> dict[str, float | None]:
    return {k: round((value[k] - ref[k]) / ref[k], 4) if ref[k] else None for k in METRICS}


def sim_cell(layout: Layout, profile: Profile, requests: list[SimRequest], slo: SLO) -> dict:
    result = simulate(layout, profile, requests)
    stolen = sum(e.stolen for e in result.encoders)
    local = sum(e.offload.local + e.offload.fallback_local for e in result.encoders)
    return figures(result.summary(slo)) | {"ttft_stages": rounded(sim_stages(result.records)),
                                           "stolen": stolen, "local_prefills": local}


# --- live --------------------------------------------------------------------------------------------

def pin(cluster: LocalCluster, pins: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    """Move each named process, every thread of it, to its core; returns each process's affinity after."""
    cores = sorted(os.sched_getaffinity(0))
    for name, core in pins:
        pid = cluster.procs[name].pid
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), {cores[core % len(cores)]})
    return {name: sorted(os.sched_getaffinity(p.pid)) for name, p in cluster.procs.items()}


def put_policy(url: str, layout: Layout) -> dict:
    body = layout.deployment_obj().policy.model_dump(mode="json")
    r = httpx.put(f"{url}/v1/admin/policy", json=body, timeout=10)
    r.raise_for_status()
    got = httpx.get(f"{url}/v1/admin/policy", timeout=10).json()
    for section, value in body.items():
        if got.get(section) != value:
            raise RuntimeError(f"the cluster runs policy {section}={got.get(section)!r}, not {value!r}")
    return got


def saved_records(records: list[ReplayRecord]) -> dict[str, list]:
    """Per request (arrival order): what re-judging under another SLO needs."""
    return {"sent": [round(r.sent, 5) for r in records], "ttft": [round(r.ttft, 5) for r in records],
            "e2e": [round(r.e2e, 5) for r in records], "output_tokens": [r.output_tokens for r in records],
            "error": [r.error for r in records]}


def loaded_records(saved: dict[str, list], requests: list[SimRequest]) -> list[ReplayRecord]:
    return [ReplayRecord(req, sent=s, ttft=math.nan if t is None else t, e2e=math.nan if e is None else e,
                         output_tokens=n, error=err)
            for req, s, t, e, n, err in zip(requests, saved["sent"], saved["ttft"], saved["e2e"],
                                            saved["output_tokens"], saved["error"])]


def encoder_stats(url: str) -> dict[str, float]:
    """The encode worker's policy counters from its last heartbeat (GET /v1/cluster)."""
    workers = httpx.get(f"{url}/v1/cluster", timeout=10).json().get("workers", [])
    return next((w.get("stats") or {} for w in workers if w["role"] == "encode"), {})


def live_run(replayer: HttpReplayer, requests: list[SimRequest], slo: SLO, progress: Progress, label: str,
             groups: dict[str, list[int]] | None = None) -> dict:
    """One replay; `groups` (name -> pids) are sampled for where they ran (sim_fidelity_host.CoreSampler)."""
    groups = groups or {}
    task = progress.add_task(label, total=len(requests))
    replayer.on_done = lambda _r: progress.advance(task)
    load_before = os.getloadavg()
    before = encoder_stats(replayer.url)
    with CoreSampler(groups) as sampler:
        records, mean_batch = replayer.run(requests)
    time.sleep(0.7)  # one heartbeat (0.5 s) carries the encode worker's counters
    after = encoder_stats(replayer.url)
    policy = {"stolen": int(after.get("stolen_total", 0) - before.get("stolen_total", 0))}
    if "offload_realised" in after:
        policy["offload_realised_last_100"] = round(after["offload_realised"], 3)
    return {"figures": figures(summarize_replay(records, slo, mean_batch)), "mean_encode_batch": round(mean_batch, 3),
            "policy": policy, "cpu_by_core": sampler.shares(),
            "ttft_stages": rounded(live_stages(records)), "failed": sum(not r.ok for r in records),
            "load_average": [[round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]],
            "records": saved_records(records)}


QUIET_CORES = 0.15
"""Wait before a measurement until others' processes use less CPU than this (a 5 s sample)..."""
NOISY_CORES = 0.3
"""...and measure again (at most RETRIES more times) when they used more than this during it."""
RETRIES = 2


def measured(meter: ForeignCPU, what: Callable[[], T], console: Console, label: str) -> tuple[T, dict]:
    """`what()` on a quiet host: waits for quiet, repeats it when others' CPU came in meanwhile; returns
    the kept result and the foreign CPU (cores) of every attempt, the kept one last."""
    attempts = []
    for i in range(RETRIES + 1):
        quiet = meter.wait_quiet(QUIET_CORES, timeout_s=900)
        meter.start()
        out = what()
        attempts.append({"before": round(quiet, 3), "during": round(meter.cores(), 3)})
        if attempts[-1]["during"] <= NOISY_CORES:
            break
        if i < RETRIES:
            console.print(f"{label}: others used {attempts[-1]['during']:.2f} cores meanwhile; measuring again")
    return out, {"foreign_cpu_cores": attempts[-1]["during"], "discarded_attempts": attempts[:-1]}


def run_layout(layout: Layout, rates: list[float], n: int, seed: int, repeats: int, command: str,
               console: Console) -> dict:
    """Both clusters up, then: profile, and per rate two live runs and a profile."""
    settings = ProfileSettings(repeats=repeats)
    prof_spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True,
                            key_prefix="tsfid-profile")
    with LocalCluster(prof_spec) as prof, LocalCluster(layout.spec()) as live, \
            Progress(console=console, transient=True) as progress:
        affinity = pin(live, layout.pins)
        policy = put_policy(live.url, layout)
        stack = [prof.procs["coordinator"].pid] + ([prof.redis.proc.pid] if prof.redis else [])

        meter = ForeignCPU()

        def take(label: str) -> tuple[Profile, list[str]]:
            def once():
                task = progress.add_task(f"{layout.name}: profile {label}", total=planned_measurements(settings, True))
                return asyncio.run(profile_cluster(prof.url, settings, source=command, stack_pids=stack,
                                                   tick=lambda k: progress.advance(task, k)))
            out, host = measured(meter, once, console, f"profile {label}")
            hosts.append({"profile": label} | host)
            return out.profile, out.notes

        profiles, notes, hosts = [], [], []
        p, nts = take("first")
        profiles.append(p)
        notes += nts
        tokens = p.encode["image"].tokens_per_item
        replayer = HttpReplayer(live.url)
        groups = {name: [proc.pid] for name, proc in live.procs.items()}
        groups["stack"] = [live.procs["coordinator"].pid] + ([live.redis.proc.pid] if live.redis else [])
        groups["replayer"] = [os.getpid()]
        warm = workload(rates[len(rates) // 2], tokens).generate(20, seed=seed + 1000)
        live_run(replayer, warm, layout.slo, progress, f"{layout.name}: warm-up")
        cells = []
        for rate in rates:
            requests = workload(rate, tokens).generate(n, seed=seed)
            runs = []
            for i in range(2):
                label = f"{layout.name} {rate:g} req/s run {i + 1}"
                out, host = measured(meter, lambda: live_run(replayer, requests, layout.slo, progress, label,
                                                             groups), console, label)
                runs.append(out | host)
            p, nts = take(f"after {rate:g} req/s")
            profiles.append(p)
            notes += nts
            cells.append({"rate": rate, "live_runs": runs,
                          "profile": pool_profiles(profiles[-2:], source=profiles[-2].source).model_dump(mode="json")})
    return {"layout": layout.name, "about": layout.about, "deployment_simulated": layout.deployment,
            "knobs": layout.knobs, "shared_cores_simulated": [sorted(g) for g in layout.shared_cores],
            "live_affinity": affinity, "live_policy": policy, "slo": layout.slo.model_dump(),
            "profile_notes": sorted(set(notes)), "profile_host": hosts, "profiles": [q.model_dump(mode="json") for q in profiles],
            "cells": cells}


# --- judging (live and simulated, from what was saved) ---------------------------------------------

def judge(report: dict, requests: int, seed: int) -> None:
    """Fill every cell's live figures (under the layout's SLO), simulation, errors and noise floor."""
    layout = LAYOUTS[report["layout"]]
    slo = SLO.model_validate(report["slo"])
    pooled = pool_profiles([Profile.model_validate(p) for p in report["profiles"]])
    for cell in report["cells"]:
        profile = Profile.model_validate(cell["profile"])
        reqs = workload(cell["rate"], profile.encode["image"].tokens_per_item).generate(requests, seed=seed)
        for run in cell["live_runs"]:
            run["figures"] = figures(summarize_replay(loaded_records(run["records"], reqs), slo))
        f = [run["figures"] for run in cell["live_runs"]]
        keys = list(METRICS) + ["slo_attainment", "throughput_rps", "ttft_p99_s", "ttft_mean_s"]
        cell["live_mean"] = {k: round(sum(x[k] for x in f) / len(f), 6) for k in keys}
        cell["noise_floor"] = {k: round(abs(f[0][k] - f[1][k]) / cell["live_mean"][k], 4) if cell["live_mean"][k]
                               else None for k in METRICS}
        stages = [run["ttft_stages"] for run in cell["live_runs"] if run["ttft_stages"]]
        cell["live_ttft_stages"] = ({k: round(sum(s[k] for s in stages) / len(stages), 5) for k in STAGES}
                                    if stages else {})
        cell["sim"] = sim_cell(layout, profile, reqs, slo)
        cell["error"] = relative(cell["sim"], cell["live_mean"])
        cell["sim_pooled"] = sim_cell(layout, pooled, reqs, slo)
        cell["error_pooled"] = relative(cell["sim_pooled"], cell["live_mean"])
        cell["within_10pct"] = all(e is not None and abs(e) <= 0.10 for e in cell["error"].values())


def markdown(result: dict) -> str:
    """The table: per layout x rate, live mean / sim / error / noise floor per metric, and attainment."""
    lines = ["# Simulator fidelity on more layouts", "",
             f"Command: `{result['command']}` ({result['date']}); {result['requests_per_rate']} requests per rate, "
             f"seed {result['seed']}; {result['machine']}.",
             "", "Error = (sim - mean of the two live runs) / that mean; noise = |run 1 - run 2| / mean. "
             "Simulated on each rate's own bracketing profiles (encode_core reading); target |error| <= 10 %.", ""]
    for rep in result["layouts"]:
        slo = rep["slo"]
        lines += [f"## {rep['layout']}: {rep['about']}", "",
                  f"Simulated as `{rep['deployment_simulated']}`, knobs `{rep['knobs']}`"
                  + (f", shared cores {rep['shared_cores_simulated']}" if rep["shared_cores_simulated"] else "")
                  + f". SLO: TTFT <= {slo['ttft_s'] * 1e3:g} ms, TPOT <= {slo['tpot_s'] * 1e3:g} ms.", "",
                  "| rate | goodput live / sim (err, noise) | P50 TTFT ms live / sim (err, noise) | "
                  "mean TPOT ms live / sim (err, noise) | attainment live / sim | load avg (others' CPU, cores) per run | "
                  "pooled-profile errors |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in rep["cells"]:
            live, sim, err, noise = c["live_mean"], c["sim"], c["error"], c["noise_floor"]

            def col(k: str, scale: float, fmt: str) -> str:
                return (f"{live[k] * scale:{fmt}} / {sim[k] * scale:{fmt}} "
                        f"({_pct(err[k])}, {_pct(noise[k], sign=False)})")
            loads = "; ".join(f"{r['load_average'][0][0]:.2f}-{r['load_average'][1][0]:.2f}"
                              + (f" ({r['foreign_cpu_cores']:.2f})" if "foreign_cpu_cores" in r else "")
                              for r in c["live_runs"])
            pooled = ", ".join(_pct(c["error_pooled"][k]) for k in METRICS)
            lines.append(f"| {c['rate']:g} | {col('goodput_rps', 1, '.2f')} | {col('ttft_p50_s', 1e3, '.1f')} | "
                         f"{col('tpot_mean_s', 1e3, '.2f')} | {live['slo_attainment']:.0%} / "
                         f"{sim['slo_attainment']:.0%} | {loads} | {pooled} |")
        lines += ["", "Mean TTFT by stage, ms, live / sim: "
                  + "; ".join(f"{c['rate']:g} req/s: " + ", ".join(
                      f"{k} {c['live_ttft_stages'].get(k, math.nan) * 1e3:.1f}/{c['sim']['ttft_stages'].get(k, math.nan) * 1e3:.1f}"
                      for k in STAGES) for c in rep["cells"]), ""]
        if any(c["sim"]["stolen"] or any(r.get("policy", {}).get("stolen") for r in c["live_runs"])
               for c in rep["cells"]):
            lines += ["Requests kept by work stealing, live runs / sim: " + "; ".join(
                f"{c['rate']:g} req/s: {'+'.join(str(r.get('policy', {}).get('stolen', '?')) for r in c['live_runs'])}"
                f" / {c['sim']['stolen']}" for c in rep["cells"]), ""]
        if rep.get("notes"):
            lines += [rep["notes"], ""]
    return "\n".join(lines) + "\n"


def _pct(x: float | None, sign: bool = True) -> str:
    return "n/a" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")


def run(names: list[str], rates: list[float] | None, n: int, seed: int, repeats: int, out: Path, command: str,
        console: Console, slos: dict[str, SLO] | None = None) -> dict:
    """Live runs of each layout, then judging; writes JSON and markdown after every layout."""
    result = {"command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()} cores, shared with other jobs (load averages per live run)",
              "requests_per_rate": n, "seed": seed, "reading": "encode_core", "engine": ENGINE.model_dump(),
              "error": "(sim - mean of the two live runs) / that mean; noise_floor = |run1 - run2| / mean",
              "target": "|error| <= 0.10", "layouts": []}
    if out.exists():  # layouts run one at a time keep the others' results
        old = json.loads(out.read_text())
        if old.get("requests_per_rate") == n and old.get("seed") == seed:
            result["layouts"] = [r for r in old.get("layouts", []) if r["layout"] not in names]
    for name in names:
        layout = LAYOUTS[name]
        if slos and name in slos:
            layout = replace(layout, slo=slos[name])
        console.print(f"[bold]{name}[/]: {layout.about}")
        rep = run_layout(layout, rates or list(layout.rates), n, seed, repeats, command, console)
        judge(rep, n, seed)
        result["layouts"].append(rep)
        result["layouts"].sort(key=lambda r: list(LAYOUTS).index(r["layout"]))
        write(result, out)
        console.print(markdown({**result, "layouts": [rep]}))
    return result


def resimulate(path: Path, slos: dict[str, SLO], out: Path | None, command: str, console: Console) -> dict:
    """Re-judge a saved result (optionally under other SLOs) and re-run its simulations."""

    result = json.loads(path.read_text())
    for rep in result["layouts"]:
        if rep["layout"] in slos:
            rep["slo"] = slos[rep["layout"]].model_dump()
        judge(rep, result["requests_per_rate"], result["seed"])
    result["resimulated"] = {"command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    console.print(markdown(result))
    if out is not None:
        write(result, out)
    return result


def write(result: dict, out: Path) -> None:

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
