"""One side of an encode GPU's SM split, on a CUDA stream this side created for itself.

The encode worker and its co-located prefill worker each hold one of these: the encoder applies its
side of the split it chooses per micro-batch, the prefill worker the side it reads from the shared
channel. Each side launches its work inside `running()`, which makes its own stream current in the
calling thread; `apply` and `running` must be called from the same thread (torch's current stream is
per thread), and the workers do so (encode_node/gpu_share.py, llm_node/gpu_share.py).

Why a stream of its own: torch's current stream on a fresh thread is the legacy default stream,
handle 0, which libsmctrl cannot mask (the shim refuses it: it has no stream struct to write into).
Masking `torch.cuda.current_stream()` would therefore fail every batch on a GPU.

Backends, the first available wins:
- "libsmctrl": one created stream per side, re-masked per micro-batch (native/smctrl.py);
- "green": CUDA green contexts (native/green_context.py), layouts pre-created for `GREEN_SHARES` of the
  GPU's SMs; per micro-batch this side's stream is the one of the layout nearest the chosen split.
  Each process creates its own contexts, and two processes' groups are not known to be disjoint SMs
  (the driver does not say which SMs a group holds): benchmarks/gpu/smpartition.py measures it.

Where partitioning cannot run (a CPU device, no CUDA driver, no backend) `reason` says why once,
`total_tpcs` stays None (no split is chosen), `apply` does nothing, `running()` changes nothing, and
the worker runs unpartitioned.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from native.green_context import GreenContexts, GreenPartition
from native.smctrl import SMControlError, SMController
from native.tpc_mask import masks_for

if TYPE_CHECKING:
    from coordinator.policies.sm_partition import TPCSplit

log = logging.getLogger(__name__)
Side = Literal["encoder", "prefill"]
GREEN_SHARES = (0.25, 0.5, 0.75)
"""Encoder shares of the SMs for which green-context layouts are pre-created (plus the whole GPU)."""


class StreamPartition:
    """Applies one side of a TPC split to this side's own CUDA stream of `device`.

    `cuda` is the ``torch.cuda`` namespace (Stream, stream, current_stream, ExternalStream); tests pass
    a stand-in whose current stream is handle 0, as a real GPU's is. `green` is tried when libsmctrl
    is unavailable.
    """

    def __init__(self, device: str, side: Side, controller: SMController | None = None,
                 cuda: Any | None = None, green: GreenContexts | None = None) -> None:
        self.side = side
        self.device = device
        self._cuda = cuda
        self.backend: str | None = None
        """"libsmctrl" or "green" when partitioning runs, else None."""
        self.stream: Any | None = None
        """This side's stream (a torch.cuda.Stream-like object, never the default stream) its kernels go to."""
        self.total_tpcs: int | None = None
        self.applied = 0
        """Splits applied so far (0 on a machine where partitioning is unsupported)."""
        self._green: dict[float, Any] = {}
        """Green backend: encoder share -> this side's stream in that layout (1.0: the whole GPU)."""
        self.reason = self._probe(controller, green)
        if self.reason is not None:
            log.warning("SM partitioning off; running unpartitioned", extra={"side": side, "reason": self.reason})

    @property
    def index(self) -> int:
        return int(self.device.partition(":")[2] or 0)

    def _cuda_module(self) -> Any:
        if self._cuda is None:
            import torch

            self._cuda = torch.cuda
        return self._cuda

    def _probe(self, controller: SMController | None, green: GreenContexts | None) -> str | None:
        if not self.device.startswith("cuda"):
            return f"unsupported: the {self.side} runs on {self.device!r}; SM partitioning needs a CUDA GPU"
        self._ctrl = controller or SMController()
        state = self._ctrl.available()
        if state.ok:
            self.stream = self._cuda_module().Stream(device=self.device)
            if self.stream.cuda_stream == 0:
                self.stream = None
                return "unsupported: a created CUDA stream has handle 0, which libsmctrl cannot mask"
            self.total_tpcs = self._ctrl.num_tpcs(self.index)
            self.backend = "libsmctrl"
            return None
        green = green or GreenContexts(self.index)
        gstate = green.available()
        if not gstate.ok:
            return f"{state.reason}; green contexts: {gstate.reason}"
        return self._probe_green(green)

    def _probe_green(self, green: GreenContexts) -> str | None:
        total_sms = green.device_sms()
        cuda = self._cuda_module()
        for share in GREEN_SHARES:
            layout: tuple[GreenPartition, GreenPartition] = green.split(max(1, round(share * total_sms)))
            mine = layout[0] if self.side == "encoder" else layout[1]
            self._green[share] = cuda.ExternalStream(mine.stream, device=self.device)
        self._green[1.0] = cuda.Stream(device=self.device)
        self.stream = self._green[1.0]
        self.total_tpcs = total_sms // 2
        self.backend = "green"
        self._green_owner = green
        return None

    @property
    def supported(self) -> bool:
        return self.reason is None

    def apply(self, split: TPCSplit) -> bool:
        """Confine this side's stream to its part of `split`; False (nothing done) when unsupported or this
        side has no TPCs this batch. Call it in the thread that then launches inside `running()`."""
        if self.reason is None and self.stream is not None and self.total_tpcs is not None:
            mine = split.encoder_tpcs if self.side == "encoder" else split.prefill_tpcs
            if split.mode != "none" and mine == 0:  # no work this batch: a mask of no TPCs must never see a launch
                return False
            if self.backend == "green":
                self.stream = self._green_stream(split)
            else:
                handle = self.stream.cuda_stream
                if handle == 0:  # never reached: the stream is created non-default; the shim would refuse it too
                    raise SMControlError("refusing to mask stream 0 (the legacy default stream)")
                encoder_mask, prefill_mask = masks_for(split, self.total_tpcs)
                self._ctrl.apply(handle, encoder_mask if self.side == "encoder" else prefill_mask, self.total_tpcs)
            self.applied += 1
            return True
        return False

    def _green_stream(self, split: TPCSplit) -> Any:
        if split.mode == "none":
            return self._green[1.0]
        total = split.encoder_tpcs + split.prefill_tpcs
        share = split.encoder_tpcs / total if total else 0.5
        return self._green[min(GREEN_SHARES, key=lambda s: abs(s - share))]

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Kernels launched in this thread inside the block go to this side's (masked) stream. The stream
        waits for the caller's stream on entry and the caller's waits for it on exit, so tensors made
        before and used after need no further synchronisation. Unsupported: nothing changes."""
        if self.stream is None:
            yield
            return
        cuda = self._cuda_module()
        caller = cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with cuda.stream(self.stream):
            yield
        caller.wait_stream(self.stream)
