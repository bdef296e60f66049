"""An LLM worker's side of the encode GPU it shares (coordinator/protocol/colocation.py).

- role "combined" on an encode GPU: the **stealing** worker (time sharing, HeteroServe). Each engine
  step runs only while the encoder is idle, holding the channel's lock for exactly that step, so an
  arriving micro-batch waits for at most one step: a decode step, or one decoder layer of a prefill,
  which gives way to it (llm_node/preemption.py). It reports how many requests it holds, so the
  encoder's WorkStealing policy can respect `max_stolen`.
- role "prefill" on an encode GPU: the **local prefill** worker of the offload share s (space sharing,
  EAServe). Before each step it applies its side of the TPC split the encoder published for the
  current micro-batch, and it publishes its backlog for the next split.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from coordinator.policies.sm_partition import TPCSplit
from coordinator.protocol.colocation import ColocationChannel
from llm_node.preemption import Preempted
from native.stream_partition import StreamPartition

T = TypeVar("T")


class LLMGpuShare:
    def __init__(self, channel: ColocationChannel, role: str, partition: StreamPartition) -> None:
        if role not in ("combined", "prefill"):
            raise ValueError(f"a worker sharing an encode GPU is a prefill or combined worker, got role={role!r}")
        self.channel = channel
        self.stealing = role == "combined"
        self.partition = partition
        self._split_seq = 0
        self.steps = 0
        self.step_seconds = 0.0
        self.longest_step_s = 0.0
        self.longest_decode_step_s = 0.0
        """The longest step that ran no prefill: the issue's unit for the delay bound."""
        self.decode_steps = 0
        self.decode_step_seconds = 0.0
        """Steps that ran no prefill, and their time: counters, so a benchmark can difference them."""
        self.deferred = 0
        """Times a step was held back because the encoder had work."""
        self.preempted = 0
        """Prefill steps abandoned between layers because the encoder arrived (llm_node/preemption.py)."""

    def run_step(self, step: Callable[[], list[T]]) -> list[T] | None:
        """Blocking (call it in the engine thread): run one engine step if this worker may now; None if
        the encoder has work (stealing worker) and the step must wait."""
        if not self.stealing:
            split = self.channel.read_split()
            if split.seq != self._split_seq:
                self._split_seq = split.seq
                self.partition.apply(TPCSplit(split.encoder_tpcs, split.prefill_tpcs, split.mode))  # type: ignore[arg-type]
            with self.partition.running():  # on this worker's own masked stream, in the thread that masked it
                return step()
        if not self.channel.step_begin():
            self.deferred += 1
            return None
        t0 = time.perf_counter()
        try:
            out = step()
        except Preempted:  # the encoder arrived during a prefill: nothing changed, retry later
            self.preempted += 1
            return None
        finally:
            self.channel.step_end()
            seconds = time.perf_counter() - t0
            self.step_seconds += seconds
        self.steps += 1
        self.longest_step_s = max(self.longest_step_s, seconds)
        if not any(getattr(o, "prefill_s", 0.0) for o in out):  # type: ignore[union-attr]
            self.longest_decode_step_s = max(self.longest_decode_step_s, seconds)
            self.decode_steps += 1
            self.decode_step_seconds += seconds
        return out

    def report(self, held_requests: int, backlog_tokens: int) -> None:
        """What the encoder's policies need from this side, written every engine loop."""
        if self.stealing:
            self.channel.set_stolen_held(held_requests)
        else:
            self.channel.set_prefill_backlog(backlog_tokens)

    def metrics(self) -> dict[str, float]:
        if not self.stealing:
            return {"sm_partition_supported": float(self.partition.supported),
                    "sm_partition_applied": float(self.partition.applied)}
        return {"stolen_steps": float(self.steps), "stolen_seconds": self.step_seconds,
                "stolen_longest_step_s": self.longest_step_s, "stolen_longest_decode_step_s": self.longest_decode_step_s,
                "stolen_decode_steps": float(self.decode_steps), "stolen_decode_seconds": self.decode_step_seconds,
                "stolen_deferred_steps": float(self.deferred), "stolen_preempted_prefills": float(self.preempted)}
