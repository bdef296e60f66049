"""The policy contract: observe events, decide what is due, say when to ask again. No I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from coordinator.policies.sm_partition import SMPartitionConfig
from coordinator.policies.work_stealing import WorkStealingConfig


@dataclass(frozen=True)
class Arrival:
    """A request joined this encode worker's open micro-batch."""

    request_id: str


@dataclass(frozen=True)
class Release:
    """Release the `count` oldest queued requests onto the worker's stream as one micro-batch."""

    count: int


class BatchPolicy(Protocol):
    def observe(self, event: Arrival, now: float) -> None: ...

    def decide(self, now: float) -> list[Release]: ...

    def next_deadline(self, now: float) -> float | None:
        """When `decide` may next return something without a new event; None = only on events."""
        ...

    def encoder_idle(self, now: float) -> None:
        """The worker's encoder finished its last released batch and has nothing queued."""
        ...


class BatchPolicyConfig(BaseModel):
    """Knobs of an encode worker's dispatch policy; changeable at run time (the admin endpoint)."""

    model_config = ConfigDict(frozen=True)

    name: Literal["pass_through", "fixed_timeout", "queue_length", "adaptive"] = "pass_through"
    """pass_through releases every arrival alone (B=1); the others are EAServe's baselines and its rule."""
    max_batch: int = Field(8, ge=1)
    """B: the most requests in one micro-batch."""
    fill_probability: float = Field(0.6, gt=0.0, lt=1.0)
    """p: adaptive's target probability that a batch fills to B before the idle threshold g."""
    max_wait_s: float = Field(1.0, gt=0.0)
    """A: hard cap on how long the oldest request of a batch may wait."""
    timeout_s: float = Field(0.05, gt=0.0)
    """fixed_timeout: release this long after a batch's first arrival."""
    queue_length: int = Field(4, ge=1)
    """queue_length: release as soon as this many requests are queued."""
    rate_window_s: float = Field(10.0, gt=0.0)
    """adaptive: arrivals older than this no longer count towards the rate estimate."""
    min_samples: int = Field(3, ge=2)
    """adaptive: below this many arrivals in the window the rate is unknown, and batches go out at once."""
    work_conserving: bool = False
    """fixed_timeout, queue_length, adaptive: also release what is queued (up to B) whenever the encoder is
    idle, so a batch only ever waits while the encoder is busy and its rule (size, g, A, timeout) forms
    the batches that pile up meanwhile. False: the rule alone, as EAServe specifies it, which holds
    requests back even from an idle encoder (on a CPU, whose encoder gains nothing from batching, that
    wait is all TTFT)."""


class OffloadConfig(BaseModel):
    """Speed-controlled partial offload: where each image request's prefill runs."""

    model_config = ConfigDict(frozen=True)

    s: float = Field(0.0, ge=0.0, le=1.0)
    """Share of prefills sent to the prefill worker co-located on the encode GPU; the rest go remote.
    With no co-located worker every prefill goes remote whatever s is."""
    saturation_load: int | None = Field(None, ge=1)
    """A side whose every worker holds at least this many requests (queued + running) is saturated: its
    prefills fall back to the other side while that one has room. None: only a side with no live worker
    falls back. Set it near the engines' max_num_seqs."""


class PolicyConfig(BaseModel):
    """Every run-time knob, as stored under `{prefix}:policy` and changed by PUT /v1/admin/policy."""

    model_config = ConfigDict(frozen=True)

    batch: BatchPolicyConfig = BatchPolicyConfig()
    offload: OffloadConfig = OffloadConfig()
    stealing: WorkStealingConfig = WorkStealingConfig()
    partition: SMPartitionConfig = SMPartitionConfig()
