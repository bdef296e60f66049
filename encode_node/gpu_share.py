"""The encoder's side of its GPU: claim it from stolen work, and split its SMs with the local prefill.

Per micro-batch: `claim` raises the busy flag and waits for the stealing worker's running step (at
most one, coordinator/protocol/colocation.py), chooses the TPC split from the batch and the local
prefill backlog (SMPartition), applies the encoder's side and publishes the split for the prefill
worker; `release` hands the GPU back once the forward pass is done. The wait is the delay stolen work
added to this batch, kept for the metrics: the issue's bound is one engine step of stolen work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig, TPCSplit
from coordinator.protocol.colocation import ColocationChannel
from native.stream_partition import StreamPartition


T = TypeVar("T")
GRACE_S = 0.002
"""Lock hand-over slack: a wait up to this much longer than the step waited on still counts as within it."""


@dataclass
class ShareStats:
    batches: int = 0
    wait_total_s: float = 0.0
    """Time micro-batches spent waiting for a stolen step to end."""
    wait_max_s: float = 0.0
    waited: int = 0
    """Micro-batches that found a stolen step in their way."""
    past_one_step: int = 0
    """Micro-batches during whose wait more than one stolen step began: the bound broken."""
    longer_than_step: int = 0
    """Micro-batches that waited longer than the step they waited on (+ GRACE_S): the bound broken."""
    last_split: TPCSplit | None = None


class EncoderGpuShare:
    def __init__(self, channel: ColocationChannel, partition: StreamPartition) -> None:
        self.channel = channel
        self.partition = partition
        self.config = SMPartitionConfig()
        self.stats = ShareStats()

    def claim(self, requests: int, image_tokens: int) -> float:
        """Blocking: take the GPU for one micro-batch and mask the encoder's stream for it (run_batch
        launches the forward in the same thread); returns seconds waited."""
        gate = self.channel.encoder_enter()
        waited = gate.seconds
        s = self.stats
        s.batches += 1
        s.wait_total_s += waited
        s.wait_max_s = max(s.wait_max_s, waited)
        if gate.steps or waited > GRACE_S:
            s.waited += 1
            s.past_one_step += gate.steps > 1
            s.longer_than_step += waited > gate.step_s + GRACE_S
        total = self.partition.total_tpcs
        if total is not None:  # None: no GPU here, nothing to split
            split = SMPartition(total, self.config).split(requests, image_tokens, self.channel.prefill_backlog())
            self.partition.apply(split)
            self.channel.publish_split(split.encoder_tpcs, split.prefill_tpcs, split.mode)
            s.last_split = split
        return waited

    def run_batch(self, requests: int, image_tokens: int, work: Callable[[], T]) -> tuple[float, T]:
        """Blocking (run it in ONE thread): claim the GPU, then run `work` (the encoder's forward) on the
        encoder's stream, masked for this batch, in the thread that masked it. Returns (seconds waited,
        what `work` returned); `release` stays the caller's, after it."""
        waited = self.claim(requests, image_tokens)
        with self.partition.running():
            return waited, work()

    def release(self, more_batches_waiting: bool) -> None:
        self.channel.encoder_exit(more_batches_waiting)

    def metrics(self) -> dict[str, float]:
        s = self.stats
        out = {"encode_gate_wait_max_s": s.wait_max_s, "encode_gate_wait_total_s": s.wait_total_s,
               "encode_gate_batches": float(s.batches), "encode_gate_waited": float(s.waited),
               "encode_gate_past_one_step": float(s.past_one_step),
               "encode_gate_longer_than_step": float(s.longer_than_step),
               "sm_partition_supported": float(self.partition.supported)}
        if s.last_split is not None:
            out |= {"encoder_tpcs": float(s.last_split.encoder_tpcs), "prefill_tpcs": float(s.last_split.prefill_tpcs)}
        return out
