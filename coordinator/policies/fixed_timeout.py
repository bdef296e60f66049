"""Fixed-timeout micro-batching (an EAServe baseline): release at B requests, or a fixed time after the
batch's first arrival, whichever comes first.

The wait is min(timeout_s, max_wait_s): A is every policy's hard cap on the oldest request's wait.
"""

from __future__ import annotations

from coordinator.policies.base import BatchPolicyConfig
from coordinator.policies.open_batch import OpenBatchPolicy


class FixedTimeout(OpenBatchPolicy):
    """Size trigger at B, time trigger at first arrival + min(timeout_s, A)."""

    def __init__(self, cfg: BatchPolicyConfig | None = None) -> None:
        cfg = cfg or BatchPolicyConfig(name="fixed_timeout")
        super().__init__(cfg, cfg.max_batch)
        self.wait_s = min(cfg.timeout_s, cfg.max_wait_s)

    def _due(self) -> float:
        return self._arrived[0] + self.wait_s
