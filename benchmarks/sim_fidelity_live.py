"""The live half of `sim_fidelity --layouts` (sim_fidelity_layouts.py): both clusters, quiet-host
measurements, live replays with where each process ran, and the bracketing profiles."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import TypeVar

import httpx
from rich.console import Console
from rich.progress import Progress

from benchmarks.sim_fidelity import rounded, workload
from benchmarks.sim_fidelity_host import METHOD, CoreSampler, ForeignCPU
from benchmarks.sim_fidelity_layouts import Layout, figures, saved_records
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.planner.goodput import SLO
from coordinator.planner.profile import Profile, pool_profiles
from coordinator.planner.profiling import (
    ProfileSettings,
    planned_measurements,
    profile_cluster,
)
from coordinator.planner.profiling_handoff import measure_kv_hop, with_kv_hop
from coordinator.planner.replay import HttpReplayer, summarize_replay
from coordinator.planner.ttft_stages import live_stages
from coordinator.planner.workload import SimRequest
from coordinator.redis_server import free_port

T = TypeVar("T")

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
            "policy": policy, "cpu_by_core": sampler.shares(), "cpu_by_core_method": METHOD,
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
    """Both clusters up, then: profile, and per rate two live runs and a profile. A layout with a decode worker
    gets a third cluster, an encode, prefill and decode worker each on a core, whose KV hand-off each profile
    takes as its kv_hop_s (profiling_handoff.py): the profiling cluster hands nothing over, and timing it on the
    live cluster would shift the offload router's line (IMAGE_REQUESTS_BEFORE)."""
    settings = ProfileSettings(repeats=repeats)
    prof_spec = ClusterSpec(encode_workers=1, llm_roles=["combined"], port=free_port(), pin_cores=True,
                            key_prefix="tsfid-profile")
    pair_spec = ClusterSpec(encode_workers=1, llm_roles=["prefill", "decode"], port=free_port(), pin_cores=True,
                            key_prefix="tsfid-handoff") if "decode" in layout.llm_roles else None
    with LocalCluster(prof_spec) as prof, LocalCluster(layout.spec()) as live, \
            (LocalCluster(pair_spec) if pair_spec else contextlib.nullcontext()) as pair, \
            Progress(console=console, transient=True) as progress:
        affinity = pin(live, layout.pins)
        policy = put_policy(live.url, layout)
        stack = [prof.procs["coordinator"].pid] + ([prof.redis.proc.pid] if prof.redis else [])

        meter = ForeignCPU()

        def take(label: str) -> tuple[Profile, list[str]]:
            def once():
                task = progress.add_task(f"{layout.name}: profile {label}", total=planned_measurements(settings, True))
                got = asyncio.run(profile_cluster(prof.url, settings, source=command, stack_pids=stack,
                                                  tick=lambda k: progress.advance(task, k)))
                if pair is not None:
                    got.profile = with_kv_hop(got.profile, asyncio.run(measure_kv_hop(pair.url))[0])
                return got
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
        groups["redis"] = [live.redis.proc.pid] if live.redis else []
        groups["replayer"] = [os.getpid()]
        warm = workload(rates[len(rates) // 2], tokens).generate(20, seed=seed + 1000)
        live_run(replayer, warm, layout.slo, progress, f"{layout.name}: warm-up")
        cells = []
        for rate in rates:
            requests = workload(rate, tokens).generate(n, seed=seed)
            runs = []
            for i in range(2):
                label = f"{layout.name} {rate:g} req/s run {i + 1}"
                replay = functools.partial(live_run, replayer, requests, layout.slo, progress, label, groups)
                out, host = measured(meter, replay, console, label)
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
