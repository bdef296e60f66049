"""The "live" trial backend: a trial applies its knobs to a running cluster and replays the workload.

Applying is wired: `apply_policy` PUTs the trial's PolicyConfig to the coordinator's
/v1/admin/policy (every section in full, so no knob of an earlier trial survives), checks that the
coordinator echoed exactly that policy, and waits `settle_s` for the encode workers, which re-read
their knobs at most once a second.

Replaying is NOT wired yet: the backend takes a `Replayer` that sends the workload's requests through
the coordinator and returns a goodput Summary measured client-side (TTFT/TPOT per request). The
benchmark client that does this lives in benchmarks/, which coordinator/ must not import; a replayer
belongs in coordinator/ once the fidelity benchmark needs one. Until then evaluate() raises
LiveTrialError saying so. Changing the allocation needs a redeploy (the admin endpoint only moves
knobs), so a live search can only vary the knobs of the allocation the cluster runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import httpx

from coordinator.planner.allocation import Allocation
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.space import TrialConfig
from coordinator.planner.trials import TrialOutcome
from coordinator.planner.workload import Workload
from coordinator.policies.base import PolicyConfig

POLICY_PATH = "/v1/admin/policy"


class LiveTrialError(RuntimeError):
    """A live trial could not run; the message says why and what to do."""


class Replayer(Protocol):
    """Sends `requests` requests of `workload` (stream `seed`) through the live cluster and judges them."""

    def replay(self, workload: Workload, requests: int, seed: int, slo: SLO) -> Summary: ...


def apply_policy(client: httpx.Client, policy: PolicyConfig, admin_token: str | None = None) -> PolicyConfig:
    """PUT `policy` to the coordinator `client` points at; returns the policy it now runs."""
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        response = client.put(POLICY_PATH, json=policy.model_dump(mode="json"), headers=headers)
    except httpx.HTTPError as exc:
        raise LiveTrialError(f"cannot reach the coordinator at {client.base_url}{POLICY_PATH}: {exc!r}; "
                             f"is the cluster up (`tierserve up`)?") from None
    if response.status_code != 200:
        try:
            reason = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:200]
        hint = " (pass the coordinator's --admin-token)" if response.status_code == 401 else ""
        raise LiveTrialError(f"PUT {POLICY_PATH} answered {response.status_code}: {reason}{hint}")
    applied = PolicyConfig.model_validate(response.json())
    if applied != policy:
        raise LiveTrialError(f"the coordinator runs {applied.model_dump()} after PUT {POLICY_PATH}, "
                             f"not the trial's {policy.model_dump()}; is another client changing the policy?")
    return applied


class LiveBackend:
    """Trials on a running cluster whose allocation is `deployed`."""

    name = "live"

    def __init__(self, client: httpx.Client, deployed: Allocation, cost_per_hour: float, workload: Workload,
                 slo: SLO, requests: int = 100, seed: int = 0, replayer: Replayer | None = None,
                 admin_token: str | None = None, settle_s: float = 1.2,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.deployed = deployed
        self.cost_per_hour = cost_per_hour
        self.workload = workload
        self.slo = slo
        self.requests = requests
        self.seed = seed
        self.replayer = replayer
        self.admin_token = admin_token
        self.settle_s = settle_s
        """Seconds to wait after applying knobs: encode workers re-read them at most once a second."""
        self.sleep = sleep

    def apply(self, config: TrialConfig) -> PolicyConfig:
        """Put the trial's knobs in force on the cluster (the part of a live trial that is wired)."""
        if config.allocation != self.deployed:
            raise LiveTrialError(f"trial wants allocation {config.allocation.label()}, but the cluster runs "
                                 f"{self.deployed.label()}; the admin endpoint only changes knobs, so search one "
                                 f"allocation live (or redeploy between trials)")
        applied = apply_policy(self.client, config.knobs.policy(), self.admin_token)
        self.sleep(self.settle_s)
        return applied

    def evaluate(self, config: TrialConfig) -> TrialOutcome:
        self.apply(config)
        if self.replayer is None:
            raise LiveTrialError("live replay is not wired yet: the knobs were applied, but no Replayer was given "
                                 "to send the workload and measure TTFT/TPOT; use the sim backend for now")
        summary = self.replayer.replay(self.workload, self.requests, self.seed, self.slo)
        return TrialOutcome.from_summary(summary, self.cost_per_hour, self.name)
