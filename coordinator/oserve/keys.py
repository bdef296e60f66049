"""OServe's Redis keys, under the cluster's prefix (the rest of the schema: coordinator/protocol/keys.py).

The routing states workers and the dispatcher read (warming, draining) are `Keys.routing`, in the protocol,
since workers may not import this package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OServeKeys:
    prefix: str = "tierserve"

    def workload(self, second: int) -> str:
        """Hash: counters of one wall-clock second (arrivals:<modality>, items, prompt_tokens, finished, good,
        failed, output_tokens, in_flight, dispatch_queue); expires after the monitor's retention."""
        return f"{self.prefix}:workload:{second}"

    @property
    def plan_current(self) -> str:
        """String (JSON PlanRecord): the plan in force and its worker layout, written by the executor."""
        return f"{self.prefix}:plan:current"

    @property
    def plan_desired(self) -> str:
        """String (JSON PlanRecord): a plan PUT /v1/admin/plan accepted and the executor has not finished."""
        return f"{self.prefix}:plan:desired"

    @property
    def plan_switch(self) -> str:
        """String (JSON SwitchStatus): the switch in progress or the last one, with its phase and times."""
        return f"{self.prefix}:plan:switch"

    @property
    def plan_executor(self) -> str:
        """String with a TTL: which executor applies plans to this cluster; absent, nobody can switch it."""
        return f"{self.prefix}:plan:executor"
