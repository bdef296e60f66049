"""How much of the host's CPU went to someone else's processes while a live run was measured.

On a shared 2-core machine another job's test cluster can take a core for minutes, and the load
average cannot say whose work it was (our own cluster keeps it near 2-3). `ForeignCPU` reads the
host's busy time (/proc/stat) and subtracts what our processes (this one, its threads, and the
clusters' process trees) used (/proc/PID/stat utime + stime), so a run can be flagged, waited out and
repeated instead of being averaged in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Self

TICK = os.sysconf("SC_CLK_TCK")


def host_busy_s() -> float:
    """CPU seconds the host has spent busy (every state but idle and iowait), all cores together."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / TICK


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` (all its threads) and its waited-for children; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return sum(int(x) for x in rest[11:15]) / TICK  # utime stime cutime cstime


def descendants(pids: Iterable[int]) -> set[int]:
    """`pids` and every process below them (a cluster's workers may start helpers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    seen, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
    return seen


class ForeignCPU:
    """Cores' worth of CPU used between `start()` and `cores()` by processes other than this one and
    its descendants (the clusters it started) and `ours()`."""

    def __init__(self, ours: Callable[[], Iterable[int]] = tuple) -> None:
        self.ours = ours
        self._t = self._host = self._mine = 0.0

    def _mine_now(self) -> float:
        return sum(process_cpu_s(p) for p in descendants([os.getpid(), *self.ours()]))

    def start(self) -> None:
        self._t, self._host, self._mine = time.monotonic(), host_busy_s(), self._mine_now()

    def cores(self) -> float:
        """Mean foreign CPU since start(), in cores (0.5 = half a core busy with others' work)."""
        wall = max(time.monotonic() - self._t, 1e-6)
        return max(0.0, (host_busy_s() - self._host) - (self._mine_now() - self._mine)) / wall

    def wait_quiet(self, below: float, sample_s: float = 5.0, timeout_s: float = 600.0) -> float:
        """Sample until a `sample_s` window has less than `below` cores of foreign CPU, at most
        `timeout_s`; returns the last sample (the caller records it either way)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.start()
            time.sleep(sample_s)
            seen = self.cores()
            if seen < below or time.monotonic() > deadline:
                return seen


METHOD = "cpu_time"
"""How CoreSampler's figures were taken, recorded with every live run's cpu_by_core. Runs sampled
before 2026-12-02 05:29Z (commit c6b3216) hold "runnable": the mean number of running-or-runnable
threads per sample and core, not CPU time; it exceeds 1 on one core when threads queue there (the
stealing layout's pinned combined worker showed 1.37), and that sampler's "stack" group (coordinator +
Redis) counted the coordinator a second time (sim_fidelity_layouts.stack_shares subtracts it)."""


class CoreSampler:
    """Where processes ran: a background thread reads every thread's CPU time and last core
    (/proc/PID/task/TID/stat) at `hz` and charges the CPU time each thread used since the previous
    sample to the core it is on now (METHOD). Pinned workers stay on their core, so theirs is exact; a
    floating process that moves between samples is charged approximately. A thread first seen after
    the first sample was born in the window: all its CPU time is charged. A thread that ends between two
    samples loses what it used since the last one (at most one period)."""

    def __init__(self, groups: dict[str, list[int]], hz: float = 50.0) -> None:
        import threading

        self.groups = groups
        self.period = 1.0 / hz
        self.cpu: dict[str, dict[int, float]] = {g: {} for g in groups}
        self._last: dict[tuple[str, int, str], float] = {}
        self._started = False
        self._wall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._t0 = time.monotonic()
        self._sample(charge=False)
        self._started = True
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        self._wall = time.monotonic() - self._t0

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self, charge: bool = True) -> None:
        me = os.getpid()
        for group, pids in self.groups.items():
            used = self.cpu[group]
            for pid in pids:
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except FileNotFoundError:
                    continue
                for tid in tids:
                    if pid == me and int(tid) == self._thread.native_id:
                        continue  # the sampler's own reading of /proc is not the replayer's work
                    try:
                        with open(f"/proc/{pid}/task/{tid}/stat") as f:
                            rest = f.read().rsplit(")", 1)[1].split()
                    except (FileNotFoundError, ProcessLookupError):
                        continue
                    total = (int(rest[11]) + int(rest[12])) / TICK
                    before = self._last.get((group, pid, tid), 0.0 if self._started else None)
                    self._last[(group, pid, tid)] = total
                    if charge and before is not None and total > before:
                        core = int(rest[36])
                        used[core] = used.get(core, 0.0) + total - before

    def shares(self) -> dict[str, dict[int, float]]:
        """Per group and core: the CPU it used there over the sampled wall time, in cores."""
        wall = max(self._wall, 1e-6)
        return {g: {core: round(c / wall, 3) for core, c in sorted(used.items())} for g, used in self.cpu.items()}
