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


class CoreSampler:
    """Where processes run: a background thread reads every thread's state and last core
    (/proc/PID/task/TID/stat) at `hz`, and counts, per process group and core, how many of them were
    running or runnable. Mean count per sample = cores' worth of CPU that group wanted there."""

    def __init__(self, groups: dict[str, list[int]], hz: float = 50.0) -> None:
        import threading

        self.groups = groups
        self.period = 1.0 / hz
        self.samples = 0
        self.running: dict[str, dict[int, int]] = {g: {} for g in groups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CoreSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.period):
            self.samples += 1
            for group, pids in self.groups.items():
                counts = self.running[group]
                for pid in pids:
                    try:
                        tids = os.listdir(f"/proc/{pid}/task")
                    except FileNotFoundError:
                        continue
                    for tid in tids:
                        if pid == me and int(tid) == self._thread.native_id:
                            continue  # the sampler itself
                        try:
                            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                                rest = f.read().rsplit(")", 1)[1].split()
                        except (FileNotFoundError, ProcessLookupError):
                            continue
                        if rest[0] == "R":
                            core = int(rest[36])
                            counts[core] = counts.get(core, 0) + 1

    def shares(self) -> dict[str, dict[int, float]]:
        """Per group and core: mean running-or-runnable threads (about the CPU it used there, in cores)."""
        n = max(self.samples, 1)
        return {g: {core: round(c / n, 3) for core, c in sorted(counts.items())} for g, counts in self.running.items()}
