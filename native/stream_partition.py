"""One side of an encode GPU's SM split, applied to the worker's current CUDA stream (libsmctrl masks).

The encode worker and its co-located prefill worker each hold one of these: the encoder applies its
side of the split it chooses per micro-batch, the prefill worker the side it reads from the shared
channel. Where partitioning cannot run (a CPU device, no CUDA driver, no libsmctrl) `reason` says why
once, `total_tpcs` stays None (no split is chosen: there are no TPCs to count), `apply` does
nothing, and the worker runs unpartitioned.

Green contexts (native/green_context.py) are the other backend the issue names; they need the work
launched on pre-created partition streams, which the reference engine does not do yet, so live
workers use libsmctrl masks and green contexts are exercised by benchmarks/gpu/smpartition.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from native.smctrl import SMController
from native.tpc_mask import masks_for

if TYPE_CHECKING:
    from coordinator.policies.sm_partition import TPCSplit

log = logging.getLogger(__name__)
Side = Literal["encoder", "prefill"]


class StreamPartition:
    """Applies one side of a TPC split to the current CUDA stream of `device`."""

    def __init__(self, device: str, side: Side, controller: SMController | None = None,
                 stream: Callable[[], int] | None = None) -> None:
        self.side = side
        self.device = device
        self._stream = stream or self._torch_stream
        """The cudaStream_t (as an int) the worker's kernels go to; default: torch's current stream."""
        self.total_tpcs: int | None = None
        self.applied = 0
        """Splits applied to the stream so far (0 on a machine where partitioning is unsupported)."""
        self.reason = self._probe(controller)
        if self.reason is not None:
            log.warning("SM partitioning off; running unpartitioned", extra={"side": side, "reason": self.reason})

    def _probe(self, controller: SMController | None) -> str | None:
        if not self.device.startswith("cuda"):
            return f"unsupported: the {self.side} runs on {self.device!r}; SM partitioning needs a CUDA GPU"
        self._ctrl = controller or SMController()
        state = self._ctrl.available()
        if not state.ok:
            return state.reason
        index = int(self.device.partition(":")[2] or 0)
        self.total_tpcs = self._ctrl.num_tpcs(index)
        return None

    @property
    def supported(self) -> bool:
        return self.reason is None

    def _torch_stream(self) -> int:
        import torch

        return torch.cuda.current_stream(self.device).cuda_stream

    def apply(self, split: TPCSplit) -> bool:
        """Mask the stream for `split`; False (nothing done) when unsupported or this side has no TPCs."""
        if self.reason is not None or self.total_tpcs is None:
            return False
        mine = split.encoder_tpcs if self.side == "encoder" else split.prefill_tpcs
        if split.mode != "none" and mine == 0:  # no work this batch: a mask of no TPCs must never see a launch
            return False
        encoder_mask, prefill_mask = masks_for(split, self.total_tpcs)
        self._ctrl.apply(self._stream(), encoder_mask if self.side == "encoder" else prefill_mask, self.total_tpcs)
        self.applied += 1
        return True
