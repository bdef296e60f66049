"""Device tensors to host memory through pinned, pre-allocated buffers: one device-to-host copy per batch.

An encoder's output (or a prefill worker's KV cache) on a GPU must reach host memory before a
transport sends it. `tensor.to("cpu")` copies into fresh pageable memory, which the driver stages
through its own pinned bounce buffer (two copies) and cannot overlap with anything. `HostStaging`
instead keeps page-locked buffers that live as long as the worker, copies a whole batch into one of
them with non-blocking copies on a copy stream of its own, and hands out views of that buffer.

Two buffers alternate (double buffering): a batch's views stay valid while the next batch is staged,
and are overwritten by the batch after that. The workers send a batch before they stage the next
but one, so that is enough; a caller that keeps the tensors longer must `.clone()` them.

`regions()` lists the buffers (address, bytes). They are the slot for transports that register
memory once (NIXL, UCX): registering them when created instead of per transfer is the follow-up, and
so is direct VRAM registration, which would skip this copy on hosts with GPUDirect.

On a CPU device nothing is staged: tensors are already in host memory and are returned as they are.
Not verifiable on a CPU machine: pinned allocation and the copy stream (benchmarks/gpu exercises them).
"""

from __future__ import annotations

from typing import Any

import torch

ALIGN = 256
"""Each tensor's view starts at a multiple of this many bytes (any dtype's alignment, and DMA-friendly)."""


def layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets of each tensor in a staging buffer, and the bytes the buffer needs."""
    offsets, end = [], 0
    for t in tensors:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + t.numel() * t.element_size()
    return offsets, end


def carve(buffer: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Views of the uint8 `buffer` shaped and typed like `tensors`, at `offsets`."""
    out = []
    for t, off in zip(tensors, offsets, strict=True):
        nbytes = t.numel() * t.element_size()
        out.append(buffer[off: off + nbytes].view(t.dtype).view(t.shape))
    return out


class HostStaging:
    """Stages a batch of device tensors into a pinned host buffer (one per slot, grown when too small)."""

    def __init__(self, device: str, slots: int = 2) -> None:
        self.device = torch.device(device)
        self.slots = slots
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._next = 0
        self._stream: Any | None = None
        self.staged_bytes = 0
        """Bytes copied device-to-host so far (a metric)."""
        self.grown = 0
        """Times a buffer was (re)allocated: a steady state allocates nothing."""

    @property
    def active(self) -> bool:
        """Whether tensors are staged at all (a CUDA device); False: to_host returns its input."""
        return self.device.type == "cuda"

    def _buffer(self, nbytes: int) -> torch.Tensor:
        slot, self._next = self._next, (self._next + 1) % self.slots
        buf = self._buffers[slot]
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (buf.numel() if buf is not None else 0), 1 << 20)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._buffers[slot] = buf
            self.grown += 1
        return buf

    def to_host(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Host tensors equal to `tensors`: views of one pinned buffer after ONE synchronisation with the
        copy stream, which first waits for the work that produced them on the caller's stream."""
        if not self.active or not tensors:
            return [t.to("cpu") for t in tensors]
        offsets, nbytes = layout(tensors)
        views = carve(self._buffer(nbytes), tensors, offsets)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for view, t in zip(views, tensors):
                view.copy_(t, non_blocking=True)
                t.record_stream(self._stream)  # its memory is not reused before the copy has read it
        self._stream.synchronize()
        self.staged_bytes += nbytes
        return views

    def regions(self) -> list[tuple[int, int]]:
        """(address, bytes) of each pinned buffer allocated so far, for a transport to register."""
        return [(b.data_ptr(), b.numel()) for b in self._buffers if b is not None]
