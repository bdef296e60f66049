"""`tierserve profile`: measure one model's service times on a cluster's workers (HAS stage 1) -> Profile.

How, and why this way. The profiler drives a RUNNING cluster through its public API and reads the
compute timings each worker reports in the answer's `tierserve` record; it does not run the encoder
and engine classes in-process:
- coordinator/ may not import encode_node or llm_node (DESIGN, dependency direction); and the numbers
  are for a live cluster: the same processes, torch threads, core pinning, model loading and batching
  code as in service, with nothing re-implemented here that could drift from them;
- the workers' own timers (the encoder call; each engine step) separate compute from the serving
  stack, and the per-hop wall-clock marks in the same record time the stack around it, so one run
  yields both the compute points (what ServiceTimes models) and the overheads (ProfileOverheads);
- isolation comes from the cluster's shape (one encode worker and one combined LLM worker, each on a
  core of its own: `ClusterSpec(pin_cores=True)`, what the CLI starts when given no --url) and from
  the workloads (profiling_phases.py): one stage is loaded at a time, and every burst is checked from
  the answers (batch sizes, shared engine steps) before it counts.
The price: batch composition is steered from outside (dispatch policy, gated bursts) and verified
rather than set directly; a burst that comes out otherwise is retried, a point never clean reported.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from coordinator.planner.live_http import (
    POLICY_PATH,
    LiveClusterError,
    PromptSizer,
    ask,
    chat_body,
    get_json,
    put_policy,
    served_model,
)
from coordinator.planner.profile import (
    DecodePoint,
    EncodeCurve,
    EncodePoint,
    PrefillPoint,
    Profile,
    ProfileOverheads,
    Stage1,
)
from coordinator.planner.profiling_phases import (
    DecodeSample,
    EncodeResult,
    PrefillSample,
    ProfileSettings,
    Tick,
    decode_phase,
    doublings,
    encode_phase,
    median,
    prefill_phase,
)
from coordinator.planner.profiling_admission import AdmissionSample, admission_phase, admit_s
from coordinator.planner.profiling_stack import STACK_TOKENS, shared_cores, stack_phase

__all__ = ["ProfileOutcome", "ProfileSettings", "planned_measurements", "profile_cluster"]


@dataclass
class ProfileOutcome:
    """A finished profile and what the run could not measure."""

    profile: Profile
    notes: list[str] = field(default_factory=list)
    """Points skipped, doubling stopped at a cap, a policy that could not be restored."""


def planned_measurements(s: ProfileSettings, stack: bool = False) -> int:
    """Measurements the run plans (the progress bar's total; early stops tick the rest off); `stack`:
    the serving stack's CPU is measured too."""
    return s.repeats * (len(doublings(s.max_encode_batch)) + len(s.prompt_lengths)
                        + len(s.decode_batches) * len(s.decode_prompts) + 1) + stack * len(STACK_TOKENS) * s.stack_requests


def check_isolated(workers: list[dict], url: str) -> None:
    """One encode worker and one combined LLM worker, nothing else: each workload meets one worker."""
    roles = sorted(f"{w['role']}{' (on ' + w['colocated_with'] + ')' if w.get('colocated_with') else ''}"
                   for w in workers)
    enc = [w for w in workers if w["role"] == "encode"]
    llm = [w for w in workers if w["role"] != "encode"]
    if len(enc) != 1 or len(llm) != 1 or llm[0]["role"] != "combined" or llm[0].get("colocated_with"):
        raise LiveClusterError(f"profiling needs exactly one encode worker and one combined LLM worker, so each "
                               f"stress workload lands on one isolated worker; {url} runs {roles or 'no worker'}. "
                               f"Start one with `tierserve up --encode 1 --llm combined`, or omit --url and "
                               f"`tierserve profile` starts its own")


def tier_of(workers: list[dict]) -> str:
    tiers = sorted({str(w.get("tier", "cpu")) for w in workers})
    if len(tiers) != 1:
        raise LiveClusterError(f"the workers report tiers {tiers}; a profile is for one tier: pass --tier, or "
                               f"profile a cluster whose workers share a tier")
    return tiers[0]


async def profile_cluster(url: str, settings: ProfileSettings | None = None, tier: str | None = None,
                          admin_token: str | None = None, source: str = "", tick: Tick = lambda n: None,
                          stack_pids: Sequence[int] = ()) -> ProfileOutcome:
    """Run the stress workloads (and the admission phase) on the cluster at `url`; restores its policy afterwards.

    `stack_pids`: the local coordinator's and Redis's processes, when this host runs them: then the
    serving stack's CPU per request and token is measured too (profiling_stack.py)."""
    s = settings or ProfileSettings()
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    load_before = os.getloadavg()
    notes: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=s.timeout_s, headers=headers,
                                 limits=httpx.Limits(max_connections=None, keepalive_expiry=2.0)) as c:
        model = await served_model(c)
        workers = (await get_json(c, "/v1/cluster")).get("workers", [])
        check_isolated(workers, url)
        tier = tier or tier_of(workers)
        saved = await get_json(c, POLICY_PATH)
        try:
            await put_policy(c, {"batch": {"name": "pass_through"}})
            for _ in range(s.warmup):
                await ask(c, chat_body(model, 8, 1, 4))
                await ask(c, chat_body(model, 8, 0, 4))
            sizer = await PromptSizer.calibrate(c, model)
            enc = await encode_phase(c, model, s, tick)
            await put_policy(c, {"batch": {"name": "pass_through"}})
            pre = await prefill_phase(c, model, sizer, s, tick)
            dec, skipped = await decode_phase(c, model, sizer, s, tick)
            joins = await admission_phase(c, model, sizer, s, tick)
            stack = await stack_phase(c, model, sizer, s, stack_pids, tick) if stack_pids else None
        finally:
            try:
                await put_policy(c, saved)
            except LiveClusterError as exc:
                notes.append(f"could not restore the cluster's policy: {exc}")
    notes += skipped
    if len(joins) < s.repeats:
        notes.append(f"admission: {len(joins)} of {s.repeats} joined bursts clean (the joins must land while the "
                     f"burst decodes); admit_s from {len(joins) or 'none'}")
    if enc.capped_at is not None:
        notes.append(f"encode doubling stopped at the encode worker's batch cap {enc.capped_at} (its "
                     f"--max-batch-size), before throughput saturated")
    if enc.note:
        notes.append(enc.note)
    load = f"load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    where = f"{source + '; ' if source else ''}{url} from host {socket.gethostname()}; {load}"
    return ProfileOutcome(build_profile(tier, model, sizer, enc, pre, dec, where, stack, joins), notes)


def build_profile(tier: str, model: str, sizer: PromptSizer, enc: EncodeResult, pre: list[PrefillSample],
                  dec: list[DecodeSample], source: str, stack: tuple[float, float] | None = None,
                  joins: list[AdmissionSample] = ()) -> Profile:
    """Medians per point, fitted overheads, and the stage-1 figures."""
    encode = {}
    enc_points = [EncodePoint(batch=b, seconds=median(xs))
                  for b, xs in _groups((e.batch, e.seconds) for e in enc.samples)]
    if enc_points and sizer.tokens_per_image:
        encode["image"] = EncodeCurve(tokens_per_item=sizer.tokens_per_image, points=tuple(enc_points))
    prefill = tuple(PrefillPoint(tokens=t, seconds=median(xs)) for t, xs in _groups((p.tokens, p.seconds) for p in pre))
    decode = tuple(DecodePoint(batch=k[0], context_tokens=k[1], seconds=median(xs))
                   for k, xs in _groups(((d.batch, d.context_tokens), d.step_s) for d in dec))
    return Profile(tier=tier, model=model, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   source=source, encode=encode, prefill=prefill, decode=decode,
                   overheads=fit_overheads(enc, pre, dec, stack, joins), stage1=_stage1(enc, enc_points, prefill, decode))


def fit_overheads(enc: EncodeResult, pre: list[PrefillSample], dec: list[DecodeSample],
                  stack: tuple[float, float] | None = None, joins: list[AdmissionSample] = ()) -> ProfileOverheads:
    # Lines through the per-batch medians: one noisy burst must not tilt them.
    enc_a, enc_b = fit_line([(b, median(xs)) for b, xs in _groups((e.batch, e.cycle_s - e.seconds) for e in enc.samples)])
    dec_a, dec_b = fit_line([(b, median(xs)) for b, xs in _groups((d.batch, d.cadence_s - d.step_s) for d in dec)])
    single = [e.latency_s for e in enc.samples if e.batch == 1] or [e.latency_s for e in enc.samples]
    ways_in = [e.in_s for e in enc.samples if e.in_s is not None]
    return ProfileOverheads(
        encode_batch_s=enc_a, encode_request_s=enc_b, decode_step_s=dec_a, decode_seq_s=dec_b,
        prefill_step_s=max(0.0, median([p.overhead_s for p in pre])) if pre else 0.0,
        hop_s=max(0.0, median([e.hop_s for e in enc.samples])) if enc.samples else 0.0,
        request_latency_s=max(0.0, median(single)) if single else 0.0,
        request_in_s=max(0.0, median(ways_in)) if ways_in else None, admit_s=admit_s(list(joins)),
        stack_cpu_request_s=stack[0] if stack else 0.0, stack_cpu_token_s=stack[1] if stack else 0.0,
        shared_cores=shared_cores() if stack else 0)


def _stage1(enc: EncodeResult, points: list[EncodePoint], prefill: Iterable[PrefillPoint],
            decode: Iterable[DecodePoint]) -> Stage1 | None:
    if not points:
        return None
    best = max(points, key=lambda p: p.batch / p.seconds)
    decodes = list(decode)
    top = max(decodes, key=lambda d: d.batch / d.seconds, default=None)
    return Stage1(encode_items_per_s=best.batch / best.seconds, encode_batch=best.batch,
                  encode_batch_capped=enc.capped_at is not None,
                  prefill_tokens_per_s=max((p.tokens / p.seconds for p in prefill), default=0.0),
                  decode_tokens_per_s=top.batch / top.seconds if top else 0.0, decode_batch=top.batch if top else 0)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope), both kept >= 0: a negative slope becomes a flat median, a
    negative intercept a line through the origin (overheads cannot be negative). (0, 0) for no points."""
    if not points:
        return 0.0, 0.0
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return max(0.0, median(ys)), 0.0
    intercept = my - slope * mx
    if intercept < 0:
        return 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return intercept, slope


def _groups(pairs: Iterable[tuple]) -> list[tuple]:
    found: dict = defaultdict(list)
    for key, value in pairs:
        found[key].append(value)
    return sorted(found.items())
