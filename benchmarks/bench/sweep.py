"""Run every (system, rate) cell of a comparison in turn, on one workload.

A system is a target with, on tierserve targets, a preset. Each target is opened once (a local
cluster starts once). Rates go in order, and at each rate every system of the target runs in turn,
its preset applied through the admin endpoint just before: the cells compared with each other run
back to back, so a shared machine's changing background load hits them alike. With `interleave`, every
live target is opened at once and each rate runs on all of them before the next rate, so that holds across
targets too (target by target, plain vLLM's cells and tierserve's were minutes apart, and this host's speed
drifts by 20-50 % within minutes). All cells use the same requests and the same unit-rate arrival gaps
(scaled by the rate), so differences between systems are not differences between draws. Cells run one at a
time: cells never load each other (a target waiting for its turn is idle: plain vLLM burns ~0.02 cores so).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np

from benchmarks.bench.client import ClientOptions, RequestRecord, send
from benchmarks.bench.cost import Cost
from benchmarks.bench.presets import Preset, PresetError, apply_policy, missing_workers, policy_for
from benchmarks.bench.slo import SLO
from benchmarks.bench.summary import judge, summarize
from benchmarks.bench.targets import LocalOptions, Target, TargetError, open_target, preflight
from benchmarks.bench.workload import RequestSpec, arrival_offsets


@dataclass(frozen=True)
class System:
    label: str
    target: Target
    preset: Preset | None


@dataclass
class Cell:
    system: str
    rate: float
    summary: dict
    records: list[RequestRecord]


@dataclass
class Plan:
    """Everything a sweep needs, resolved from the command line."""

    systems: list[System]
    rates: list[float]
    """Requests per second; inf = all at once; nan = the dataset's own timestamps (--request-rate trace)."""
    specs: list[RequestSpec]
    """The requests of every cell without its own in `rate_specs` (a dataset's, and the first rate's)."""
    gaps: np.ndarray
    """Unit-rate inter-arrival gaps, one per request."""
    slo: SLO | None
    costs: dict[str, Cost]
    model: str | None
    client: ClientOptions
    max_concurrency: int | None
    duration_s: float | None
    warmup_specs: list[RequestSpec]
    """Sent, unrecorded and one at a time, before each system's first cell."""
    local: LocalOptions
    sims: dict[Target, Any] = field(default_factory=dict)
    """Loaded plan files (sim_target.SimTarget) of the sim targets."""
    admin_headers: dict[str, str] = field(default_factory=dict)
    interleave: bool = False
    """Open every live target at once and run each rate on all of them before the next (see the module)."""
    rate_specs: dict[float, list[RequestSpec]] = field(default_factory=dict)
    """A synthesized workload's requests per rate: every system gets the same requests at a rate, but no rate
    repeats another's images and prompts, so a server's prefix or encoder cache (vLLM's are on by default)
    never answers one cell from an earlier cell's requests."""


class Observer(Protocol):
    def cell_started(self, label: str, total: int) -> None: ...
    def request_done(self) -> None: ...
    def cell_finished(self, cell: Cell) -> None: ...
    def note(self, message: str) -> None: ...


def offsets_for(plan: Plan, rate: float) -> tuple[list[RequestSpec], list[float]]:
    """The requests of one cell and their send offsets; --duration keeps those that start within it."""
    if math.isnan(rate):
        pairs = sorted(((s.timestamp or 0.0, s) for s in plan.specs), key=lambda p: p[0])
        t0 = pairs[0][0] if pairs else 0.0
        return [s for _, s in pairs], [t - t0 for t, _ in pairs]
    offsets = arrival_offsets(plan.gaps, rate)
    keep = len(offsets) if plan.duration_s is None else int(np.searchsorted(offsets, plan.duration_s, side="left"))
    specs = plan.rate_specs.get(rate, plan.specs)
    return specs[:max(1, keep)], [float(x) for x in offsets[:max(1, keep)]]


async def run_cell(url: str, specs: list[RequestSpec], offsets: list[float], opts: ClientOptions,
                   max_concurrency: int | None, on_done) -> tuple[list[RequestRecord], float]:
    """Open loop: request i is sent at offsets[i] whatever earlier ones are doing (under
    --max-concurrency it waits for a free slot, and `sent_s` shows by how much)."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                          keepalive_expiry=2.0)  # under any server's idle timeout: no reuse of a closing connection
    async with httpx.AsyncClient(base_url=url, timeout=opts.timeout_s, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(spec: RequestSpec, offset: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
            rec = RequestRecord(index=spec.index, scheduled_s=round(offset, 6))
            if sem is None:
                await send(client, spec, opts, rec, t0)
            else:
                async with sem:
                    await send(client, spec, opts, rec, t0)
            on_done()
            return rec

        records = await asyncio.gather(*(one(s, o) for s, o in zip(specs, offsets)))
        return list(records), time.perf_counter() - t0


def _warm_up(url: str, plan: Plan, opts: ClientOptions, label: str) -> None:
    """A few sequential requests, unrecorded; if none succeeds, the target cannot be measured."""
    specs = plan.warmup_specs
    if not specs:
        return
    records, _ = asyncio.run(run_cell(url, specs, [0.0] * len(specs), opts, 1, lambda: None))
    if not any(r.ok for r in records):
        r = records[0]
        raise TargetError(f"{label}: every warm-up request failed ({r.error_type}: {r.error}); not an OpenAI-compatible "
                          "chat-completions server, or the workload is one it rejects (see --modality, --model; a server that "
                          "refuses unknown fields needs --no-ignore-eos)")


def _apply(url: str, system: System, policy: dict[str, Any], plan: Plan) -> None:
    with httpx.Client(base_url=url, headers=plan.admin_headers, timeout=10) as admin:
        apply_policy(admin, policy, f"preset {system.preset.name if system.preset else '?'} on {system.target.label}")


def _policy(system: System, rate: float, plan: Plan, encode_workers: int) -> dict[str, Any] | None:
    if system.preset is None:
        return None
    return policy_for(system.preset, rate, encode_workers, plan.slo.ttft_ms if plan.slo else None)


def run(plan: Plan, observer: Observer, failures: list[str] | None = None) -> list[Cell]:
    """Every cell, system-major (rate-major over all live targets with `plan.interleave`). A target that fails
    (unreachable, a preset refused, every warm-up failed) is reported in `failures` and the others still run,
    keeping the cells measured so far; without a `failures` list, the first such error is raised."""
    cells: list[Cell] = []
    targets: dict[Target, list[System]] = {}
    for s in plan.systems:
        targets.setdefault(s.target, []).append(s)

    def failed(e: Exception) -> None:
        if failures is None:
            raise e
        failures.append(str(e))
        observer.note(f"[red]error:[/] {e}; the other targets still run")

    live = {t: systems for t, systems in targets.items() if t.kind != "sim"}
    for target, systems in targets.items():
        if target.kind == "sim":
            try:
                for system in systems:
                    cells += [_sim_cell(system, rate, plan, observer) for rate in plan.rates]
            except (TargetError, PresetError) as e:
                failed(e)
        elif not plan.interleave:
            try:
                with Session.open(target, systems, plan, observer) as session:
                    for i, rate in enumerate(plan.rates):
                        session.run_rate(i, rate, plan, observer, cells)
            except (TargetError, PresetError) as e:
                failed(e)
    if plan.interleave and live:
        with contextlib.ExitStack() as every:
            sessions: list[tuple[Session, contextlib.ExitStack]] = []
            for target, systems in live.items():
                own = every.enter_context(contextlib.ExitStack())  # closed at once if its target fails later
                try:
                    sessions.append((own.enter_context(Session.open(target, systems, plan, observer)), own))
                except (TargetError, PresetError) as e:
                    failed(e)
            for i, rate in enumerate(plan.rates):
                for session, own in list(sessions):
                    try:
                        session.run_rate(i, rate, plan, observer, cells)
                    except (TargetError, PresetError) as e:
                        sessions.remove((session, own))
                        own.close()
                        failed(e)
    order = {s.label: i for i, s in enumerate(plan.systems)}
    return sorted(cells, key=lambda c: (order[c.system], plan.rates.index(c.rate) if not math.isnan(c.rate) else 0))


def _as_itself(target: Target, systems: list[System], plan: Plan, observer: Observer) -> list[System]:
    """A server that is not a tierserve coordinator cannot take presets: it is measured once, as it is
    configured, under the target's name (so the same command runs against vLLM, SGLang, ...)."""
    system = System(target.label, target, None)
    observer.note(f"[yellow]warning:[/] {target.label} is not a tierserve coordinator (GET /v1/admin/policy gave "
                  f"no policy), so presets {[s.preset.name for s in systems if s.preset]} cannot be applied; it is "
                  f"measured once, as it is configured, as {system.label!r} (pass --admin-token if it is a "
                  f"coordinator with a token)")
    first_cost = next((plan.costs[s.label] for s in systems if s.label in plan.costs), None)
    if first_cost is not None:
        plan.costs.setdefault(system.label, first_cost)
    i = plan.systems.index(systems[0])
    plan.systems[:] = [s for s in plan.systems if s not in systems]
    plan.systems.insert(i, system)
    return [system]


@dataclass
class Session:
    """One live target, open for the run: its URL, what preflight found, and the policy in force."""

    target: Target
    systems: list[System]
    url: str
    info: Any
    opts: ClientOptions
    n_encode: int
    presets: list[Preset]
    applied: dict[str, Any] | None = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, target: Target, systems: list[System], plan: Plan, observer: Observer):
        """Open `target` (a local cluster or plain vLLM starts here) and preflight it; on leaving, put back the
        policy found (URL targets) and stop what was started."""
        presets = [s.preset for s in systems if s.preset is not None]
        with open_target(target, presets, plan.local, observer.note) as url:
            info = preflight(url, plan.client.headers, plan.admin_headers)
            if presets and any(p.policy for p in presets) and info.policy is None:
                systems, presets = _as_itself(target, systems, plan, observer), []
            model = plan.model or (info.models[0] if info.models else None)
            if model is None:
                raise TargetError(f"{target.label} serves no models (GET /v1/models is empty); pass --model")
            if plan.model and plan.model not in info.models:
                observer.note(f"[yellow]warning:[/] {target.label} lists models {info.models}, not {plan.model!r}")
            opts = ClientOptions(model=model, ignore_eos=plan.client.ignore_eos, timeout_s=plan.client.timeout_s,
                                 headers=plan.client.headers)
            n_encode = sum(w.get("role") == "encode" for w in info.workers) or 1
            for system in systems:
                for missing in missing_workers(system.preset, info.workers) if system.preset else []:
                    observer.note(f"[yellow]warning:[/] {system.label}: the cluster has no {missing}; the preset runs "
                                  "without it")
            try:
                yield cls(target, systems, url, info, opts, n_encode, presets)
            finally:
                if info.policy is not None and presets and target.kind == "url":
                    with httpx.Client(base_url=url, headers=plan.admin_headers, timeout=10) as admin:
                        try:
                            apply_policy(admin, info.policy, "restoring the policy")
                        except PresetError as e:
                            observer.note(f"[yellow]warning:[/] {e}")

    def run_rate(self, i: int, rate: float, plan: Plan, observer: Observer, cells: list[Cell]) -> None:
        """The cells of rate number `i`, each system in turn: apply its preset's policy (when it differs from the
        one in force), warm up (first rate only), replay. Appends to `cells` as it goes, so a failure keeps what
        was measured."""
        for system in self.systems:
            policy = _policy(system, rate, plan, self.n_encode)
            if policy is None and system.preset is not None:
                policy = self.info.policy  # `current`: the policy found, even after another preset ran
            if policy is not None and policy != self.applied:
                _apply(self.url, system, policy, plan)
                self.applied = policy
            if i == 0:
                _warm_up(self.url, plan, self.opts, system.label)
            cells.append(_cell(self.url, system, rate, plan, self.opts, observer, policy))


def _cell(url: str, system: System, rate: float, plan: Plan, opts: ClientOptions, observer: Observer,
          policy: dict[str, Any] | None) -> Cell:
    specs, offsets = offsets_for(plan, rate)
    observer.cell_started(f"{system.label} @ {rate_label(rate)}", len(specs))
    records, wall = asyncio.run(run_cell(url, specs, offsets, opts, plan.max_concurrency, observer.request_done))
    return _finish(system, rate, plan, records, wall, offsets, observer, policy)


def _sim_cell(system: System, rate: float, plan: Plan, observer: Observer) -> Cell:
    """The same requests and offsets on the simulator (--max-concurrency does not apply: it is open loop)."""
    specs, offsets = offsets_for(plan, rate)
    observer.cell_started(f"{system.label} @ {rate_label(rate)} (simulated)", len(specs))
    sim = plan.sims[system.target]
    policy = _policy(system, rate, plan, sim.encode_workers())
    records, wall = sim.run_cell(specs, offsets, policy)
    for _ in records:
        observer.request_done()
    return _finish(system, rate, plan, records, wall, offsets, observer, policy)


def _finish(system: System, rate: float, plan: Plan, records: list[RequestRecord], wall: float, offsets: list[float],
            observer: Observer, policy: dict[str, Any] | None) -> Cell:
    judge(records, plan.slo)
    summary = summarize(records, wall, plan.slo, plan.costs.get(system.label))
    # The rate the trace really offered: short runs drift from the nominal rate by chance.
    summary["offered_rps"] = round((len(offsets) - 1) / offsets[-1], 4) if len(offsets) > 1 and offsets[-1] > 0 else None
    summary["simulated"] = system.target.kind == "sim"
    summary["policy"] = policy  # what PUT /v1/admin/policy set for this cell (None: nothing)
    cell = Cell(system=system.label, rate=rate, summary=summary, records=records)
    observer.cell_finished(cell)
    return cell


def rate_label(rate: float) -> str:
    return "trace" if math.isnan(rate) else "inf" if math.isinf(rate) else f"{rate:g} req/s"
