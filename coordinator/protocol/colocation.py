"""What an encode worker and the LLM workers on its GPU share: a small memory-mapped file on their host.

Two kinds of sharing happen on an encode GPU, and both need a signal faster than a Redis round trip:

- **Time sharing (work stealing).** A stealing LLM worker steps only while the encoder is idle. The
  encode worker raises `encoder_busy` and then takes the file's exclusive lock; the stealing worker
  holds the same lock for exactly one engine step, and only starts one after seeing `encoder_busy`
  down. So an arriving micro-batch waits at most for the one step already running, never longer
  (`encoder_enter` returns that wait, and the worker reports it).
- **Space sharing (SM partitioning).** The encode worker publishes, per micro-batch, the TPC split
  chosen by `SMPartition`; the co-located prefill worker applies its side before its next step, and
  publishes its prefill backlog (tokens) for the next split.

The file lives in a per-user runtime directory, named by the key prefix and the encode worker's id, so
clusters sharing a host never meet. Fields are little-endian at fixed offsets; each is written by one
side only, so no field needs a lock. `flock` locks belong to the open file, not the thread, so the
lock may be taken and released from worker threads.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_SIZE = 64
_BUSY = struct.Struct("<I")  # offset 0: encoder busy (written by the encode worker)
_SPLIT = struct.Struct("<IIII")  # offset 8: seq, encoder TPCs, prefill TPCs, mode (encode worker)
_BACKLOG = struct.Struct("<Q")  # offset 24: prefill backlog tokens (co-located prefill worker)
_HELD = struct.Struct("<I")  # offset 32: requests the stealing worker holds (stealing worker)
_STEPS = struct.Struct("<Qd")  # offset 40: stolen steps begun, the last one's seconds (stealing worker)
_MODES = ("none", "static", "dynamic")


@dataclass(frozen=True)
class PublishedSplit:
    """The TPC split of the current encoder micro-batch, as the encode worker published it."""

    seq: int
    """Increases with every published split; 0 = none published yet."""
    encoder_tpcs: int
    prefill_tpcs: int
    mode: str


def channel_path(key_prefix: str, encode_worker_id: str, runtime_dir: Path | None = None) -> Path:
    """Where the channel of `encode_worker_id` lives on this host."""
    base = runtime_dir or Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"tierserve-{os.getuid()}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{key_prefix}-{encode_worker_id}")
    return base / f"{safe}.gpu"


@dataclass(frozen=True)
class GateWait:
    """What one micro-batch waited for before the encoder had its GPU back from stolen work."""

    seconds: float
    """From raising the busy flag to holding the lock."""
    steps: int
    """Stolen steps begun from the moment the flag went up until the lock was ours: 0 or 1 (the one a
    step_begin that had already passed its check may start). More means the time sharing is broken."""
    step_s: float
    """Duration of the last stolen step that ended before the lock was ours (the one waited on, when
    `steps` or `seconds` say there was one)."""


class ColocationChannel:
    """One side's handle on the shared file; every worker on the encode GPU opens its own."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < _SIZE:
            os.ftruncate(self._fd, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE)
        self._seq = 0
        self._step_t0 = 0.0

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    # time sharing ----------------------------------------------------------------------------------
    @property
    def encoder_busy(self) -> bool:
        return bool(_BUSY.unpack_from(self._map, 0)[0])

    def encoder_enter(self) -> GateWait:
        """Encoder side, blocking: claim the GPU for a micro-batch; returns what it waited for."""
        _BUSY.pack_into(self._map, 0, 1)
        t0 = time.perf_counter()
        begun, _ = _STEPS.unpack_from(self._map, 40)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        waited = time.perf_counter() - t0
        now_begun, step_s = _STEPS.unpack_from(self._map, 40)
        return GateWait(waited, now_begun - begun, step_s)

    def encoder_exit(self, more_batches_waiting: bool) -> None:
        """Encoder side: give the GPU back; stay "busy" while further micro-batches are already queued."""
        _BUSY.pack_into(self._map, 0, 1 if more_batches_waiting else 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def step_begin(self) -> bool:
        """Stealing side, blocking: True = the lock is held for one step (call `step_end` after it);
        False = the encoder has work, do not step."""
        if self.encoder_busy:
            return False
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        if self.encoder_busy:  # it arrived while we waited for the lock: let it go first
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            return False
        begun, last = _STEPS.unpack_from(self._map, 40)
        _STEPS.pack_into(self._map, 40, begun + 1, last)
        self._step_t0 = time.perf_counter()
        return True

    def step_end(self) -> None:
        """Stealing side: the step is over; its duration is written before the lock goes."""
        begun, _ = _STEPS.unpack_from(self._map, 40)
        _STEPS.pack_into(self._map, 40, begun, time.perf_counter() - self._step_t0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def set_stolen_held(self, requests: int) -> None:
        """Stealing side: requests it holds (taken from its stream, not finished)."""
        _HELD.pack_into(self._map, 32, max(0, requests))

    def stolen_held(self) -> int:
        return _HELD.unpack_from(self._map, 32)[0]

    # space sharing ---------------------------------------------------------------------------------
    def publish_split(self, encoder_tpcs: int, prefill_tpcs: int, mode: str) -> None:
        """Encoder side: the split for the micro-batch about to run."""
        self._seq += 1
        _SPLIT.pack_into(self._map, 8, self._seq, encoder_tpcs, prefill_tpcs, _MODES.index(mode))

    def read_split(self) -> PublishedSplit:
        seq, enc, pre, mode = _SPLIT.unpack_from(self._map, 8)
        return PublishedSplit(seq, enc, pre, _MODES[mode] if mode < len(_MODES) else "none")

    def set_prefill_backlog(self, tokens: int) -> None:
        """Prefill side: tokens waiting or running at the co-located prefill worker."""
        _BACKLOG.pack_into(self._map, 24, max(0, tokens))

    def prefill_backlog(self) -> int:
        return _BACKLOG.unpack_from(self._map, 24)[0]
