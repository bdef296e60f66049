"""The "live" trial backend: a trial applies its knobs to a running cluster and replays the workload.

Applying: `apply_policy` PUTs the trial's PolicyConfig to the coordinator's /v1/admin/policy (every
section in full, so no knob of an earlier trial survives), checks that the coordinator echoed exactly
that policy, and waits `settle_s` for the encode workers, which re-read their knobs at most once a second.

Replaying: a `Replayer` sends the workload's requests through the coordinator and returns a goodput
Summary measured client-side (TTFT/TPOT per request). The default is replay.py's HttpReplayer
(open-loop streaming replay against the client's base URL), so a live trial runs end to end; tests
inject their own. Changing the allocation needs a redeploy (the admin endpoint only moves knobs), so a
live search can only vary the knobs of the allocation the cluster runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import httpx

from coordinator.planner.allocation import Allocation
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.live_http import LiveClusterError
from coordinator.planner.replay import HttpReplayer
from coordinator.planner.space import TrialConfig
from coordinator.planner.trials import TrialOutcome
from coordinator.planner.workload import Workload
from coordinator.policies.base import PolicyConfig

POLICY_PATH = "/v1/admin/policy"


class LiveTrialError(LiveClusterError):
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
        self.replayer = replayer or HttpReplayer(str(client.base_url))
        """Sends the workload and judges it; default: HttpReplayer at the client's base URL."""
        self.admin_token = admin_token
        self.settle_s = settle_s
        """Seconds to wait after applying knobs: encode workers re-read them at most once a second."""
        self.sleep = sleep

    def apply(self, config: TrialConfig) -> PolicyConfig:
        """Put the trial's knobs in force on the cluster."""
        if config.allocation != self.deployed:
            raise LiveTrialError(f"trial wants allocation {config.allocation.label()}, but the cluster runs "
                                 f"{self.deployed.label()}; the admin endpoint only changes knobs, so search one "
                                 f"allocation live (or redeploy between trials)")
        applied = apply_policy(self.client, config.knobs.policy(), self.admin_token)
        self.sleep(self.settle_s)
        return applied

    def evaluate(self, config: TrialConfig) -> TrialOutcome:
        self.apply(config)
        try:
            summary = self.replayer.replay(self.workload, self.requests, self.seed, self.slo)
        except LiveTrialError:
            raise
        except LiveClusterError as exc:
            raise LiveTrialError(f"trial {config.label()}: the replay failed: {exc}") from None
        return TrialOutcome.from_summary(summary, self.cost_per_hour, self.name)
