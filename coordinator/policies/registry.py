"""Batch policies by name: `BatchPolicyConfig.name` -> the class that implements it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from coordinator.policies.adaptive import AdaptiveMicroBatch
from coordinator.policies.base import BatchPolicy, BatchPolicyConfig
from coordinator.policies.fixed_timeout import FixedTimeout
from coordinator.policies.pass_through import PassThrough
from coordinator.policies.queue_length import QueueLengthTrigger

BATCH_POLICIES: Mapping[str, Callable[[BatchPolicyConfig], BatchPolicy]] = MappingProxyType({
    "pass_through": PassThrough,
    "fixed_timeout": FixedTimeout,
    "queue_length": QueueLengthTrigger,
    "adaptive": AdaptiveMicroBatch,
})


def make_batch_policy(cfg: BatchPolicyConfig) -> BatchPolicy:
    """A fresh policy object (one per encode worker: each holds that worker's queue state)."""
    try:
        factory = BATCH_POLICIES[cfg.name]
    except KeyError:
        raise ValueError(f"unknown batch policy {cfg.name!r}; known: {sorted(BATCH_POLICIES)}") from None
    return factory(cfg)
