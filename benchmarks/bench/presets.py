"""Named configurations of a tierserve cluster: the baselines the seeds compare against, and tierserve.

A preset is a policy (the body of `PUT /v1/admin/policy`, applied live to a tierserve coordinator)
plus the workers it needs beside each encode worker. On `--target local` the bench starts one
cluster holding the workers every chosen preset needs, and switches between presets with the admin
endpoint, so all presets run on the same processes and cores. On a URL target the cluster is what it
is; a preset whose workers are missing there still runs, with a warning (e.g. an offload share s with
no co-located prefill worker sends every prefill remote).

  current          the policy the coordinator had when the run started (put back if another preset ran
                   first); on any other OpenAI server, nothing
  monolithic       like vLLM, every GPU runs E+P+D: each request is encoded, prefilled and decoded on its
                   encode GPU by a co-located combined worker (work stealing with no load threshold, time
                   sharing the GPU); pass-through batching, no SM partition. Remote LLM workers only take
                   requests past max_stolen.
  passthrough-epd  Dynamo-style disaggregated E -> P/D: every arrival encoded alone (B=1), every prefill
                   remote (s=0), no stealing, no SM partition
  easerve          EAServe's control point: adaptive micro-batching (B=8, p=0.6, A=1 s), partial offload
                   s=0.3 to a co-located prefill worker, dynamic SM partition per micro-batch, no stealing
  heteroserve      HeteroServe: pass-through encode on the consumer tier, cross-type work stealing (an idle
                   encode GPU serves whole requests when remote LLM workers hold >= 1), no offload/partition
  tierserve        everything: adaptive micro-batching with the knobs the planner seeds for the cell's rate
                   (B = ceil(rate / encode workers), age cap A = 10% of the --goodput TTFT target, as
                   benchmarks/control_point.py's adaptive_planned), offload s=0.3, dynamic SM partition and
                   work stealing

EAServe's own defaults (B=8, A=1 s) hold a lone request up to a second at low rates, which a CPU encoder
(little gain from batching) never earns back; tierserve's planner sizes B and A to the rate and SLO, so
its preset is re-applied before every rate of a sweep. s=0.3 is a middle value; the planner picks s per
deployment. SM partitioning needs a GPU (on a CPU
cluster workers report it unsupported and run unpartitioned), so on CPU easerve and tierserve differ
from the others by batching, offload and stealing only.
"""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from coordinator.policies.base import PolicyConfig

ADAPTIVE = {"name": "adaptive", "max_batch": 8, "fill_probability": 0.6, "max_wait_s": 1.0}
PASS = {"name": "pass_through"}
NO_STEAL = {"enabled": False}
STEAL = {"enabled": True, "max_stolen": 4, "remote_load_threshold": 1, "quiet_s": 0.0}


class Preset(BaseModel):
    """A policy to apply and the co-located workers it needs."""

    model_config = ConfigDict(frozen=True)

    name: str
    summary: str
    """One line for --help and the report."""
    policy: dict[str, dict[str, Any]] | None
    """PUT /v1/admin/policy body; None applies nothing."""
    needs_local_prefill: bool = False
    """Uses a prefill worker co-located on each encode GPU (offload share s > 0)."""
    needs_stealer: bool = False
    """Uses a combined worker co-located on each encode GPU (work stealing)."""
    planned_batch: bool = False
    """Size B and A per cell as the planner seeds them (see `policy_for`)."""


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(name="current", summary="the server's policy as found at the start of the run", policy=None),
    Preset(name="monolithic", summary="E+P+D on every GPU, like vLLM",
           policy={"batch": PASS, "offload": {"s": 0.0}, "partition": {"mode": "none"},
                   "stealing": {"enabled": True, "max_stolen": 64, "remote_load_threshold": 0, "quiet_s": 0.0}},
           needs_stealer=True),
    Preset(name="passthrough-epd", summary="disaggregated, B=1, s=0, no stealing (Dynamo-style)",
           policy={"batch": PASS, "offload": {"s": 0.0}, "stealing": NO_STEAL, "partition": {"mode": "none"}}),
    Preset(name="easerve", summary="adaptive batching, offload s=0.3, dynamic SM split",
           policy={"batch": ADAPTIVE, "offload": {"s": 0.3}, "stealing": NO_STEAL, "partition": {"mode": "dynamic"}},
           needs_local_prefill=True),
    Preset(name="heteroserve", summary="pass-through encode + cross-type work stealing",
           policy={"batch": PASS, "offload": {"s": 0.0}, "stealing": STEAL, "partition": {"mode": "none"}},
           needs_stealer=True),
    Preset(name="tierserve", summary="planner-sized work-conserving adaptive batching + offload + SM split + stealing",
           policy={"batch": {**ADAPTIVE, "work_conserving": True}, "offload": {"s": 0.3}, "stealing": STEAL,
                   "partition": {"mode": "dynamic"}},
           needs_local_prefill=True, needs_stealer=True, planned_batch=True),
)}

POLICY_REFRESH_S = 1.2
"""Encode workers re-read the stored policy at most once a second; wait this long after a change."""


PLANNED_WAIT_SHARE = 0.1
"""A planned batch may spend at most this share of the TTFT target waiting to fill."""


def policy_for(preset: Preset, rate: float, encode_workers: int, ttft_ms: float | None) -> dict[str, Any] | None:
    """The policy to apply for one cell: the preset's, with planned batch knobs when it asks for them
    (B = ceil(rate / encode workers), 8 for inf or a trace; A = 10% of the TTFT target, or 1 s without one)."""
    if preset.policy is None or not preset.planned_batch:
        return preset.policy
    b = 8 if not math.isfinite(rate) else max(1, math.ceil(rate / max(1, encode_workers)))
    wait = round(PLANNED_WAIT_SHARE * ttft_ms / 1e3, 4) if ttft_ms else ADAPTIVE["max_wait_s"]
    return {**preset.policy, "batch": {**preset.policy["batch"], "max_batch": b, "max_wait_s": wait}}


class PresetError(RuntimeError):
    """A preset could not be applied; the message says why and what to do."""


def parse_presets(items: list[str]) -> list[Preset]:
    names = [n.strip() for raw in items for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise PresetError(f"--preset: unknown preset(s) {unknown}; choose from {', '.join(PRESETS)}")
    if len(set(names)) != len(names):
        raise PresetError(f"--preset names a preset twice: {names}")
    return [PRESETS[n] for n in names]


def missing_workers(preset: Preset, workers: list[dict[str, Any]]) -> list[str]:
    """What `preset` needs that the cluster (GET /v1/cluster's workers) lacks."""
    colocated = {w.get("role") for w in workers if w.get("colocated_with")}
    out = []
    if preset.needs_local_prefill and "prefill" not in colocated:
        out.append("a prefill worker co-located with an encode worker (tierserve up --local-prefill)")
    if preset.needs_stealer and "combined" not in colocated:
        out.append("a combined worker co-located with an encode worker (tierserve up --steal)")
    return out


def read_policy(client: httpx.Client) -> dict[str, Any] | None:
    """The coordinator's policy, or None when the target is not a tierserve coordinator (or forbids us)."""
    try:
        r = client.get("/v1/admin/policy")
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) and "batch" in body else None


def apply_policy(client: httpx.Client, policy: dict[str, Any], what: str) -> None:
    """PUT `policy`, each section it names in full: the endpoint merges, so a knob a section leaves out
    (e.g. work_conserving after the tierserve preset) would otherwise linger from the previous system."""
    try:
        full = PolicyConfig.model_validate(policy).model_dump(mode="json")
    except ValueError as e:
        raise PresetError(f"{what}: not a valid policy: {e}") from None
    try:
        r = client.put("/v1/admin/policy", json={section: full[section] for section in policy})
    except httpx.HTTPError as e:
        raise PresetError(f"{what}: PUT /v1/admin/policy failed: {e}") from None
    if r.status_code == 401:
        raise PresetError(f"{what}: the coordinator wants an admin token; pass --admin-token")
    if r.status_code != 200:
        raise PresetError(f"{what}: PUT /v1/admin/policy answered {r.status_code}: {r.text[:300]}")
    time.sleep(POLICY_REFRESH_S)
