"""Queue-length trigger (an EAServe baseline): release as soon as `queue_length` requests are queued.

The threshold is capped at B (a batch can never hold more), and the hard cap A still applies: a
request that the threshold would hold at low load goes out once the oldest queued one has waited A.
"""

from __future__ import annotations

from coordinator.policies.base import BatchPolicyConfig
from coordinator.policies.open_batch import OpenBatchPolicy


class QueueLengthTrigger(OpenBatchPolicy):
    """Release min(queued, B) once min(queue_length, B) are queued; or everything queued at first arrival + A."""

    def __init__(self, cfg: BatchPolicyConfig | None = None) -> None:
        cfg = cfg or BatchPolicyConfig(name="queue_length")
        super().__init__(cfg, min(cfg.queue_length, cfg.max_batch))
        self.threshold = self.trigger

    def _due(self) -> float:
        return self._arrived[0] + self.cfg.max_wait_s
