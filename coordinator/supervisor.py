"""Keeps a local cluster's processes running: a process that exits is logged with its cause and started
again after a backoff, up to a restart limit per window; the rest of the cluster keeps serving meanwhile.

Pure bookkeeping with an injected clock; the launcher does the spawning and calls `due` and `exited`.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field


class RestartPolicy(BaseModel):
    model_config = ConfigDict(frozen=True)

    backoff_s: float = Field(0.5, gt=0)
    """Wait before the first restart of a process; doubled for each further restart within the window."""
    max_backoff_s: float = Field(10.0, gt=0)
    max_restarts: int = Field(5, ge=0)
    """Most restarts of one process within `window_s`; past it the process stays down (and is reported)."""
    window_s: float = Field(300.0, gt=0)


def exit_cause(returncode: int) -> str:
    """"exit code 1", "killed by SIGKILL", ... (Popen gives -N for a signal N)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class _Record:
    restarts: deque[float] = field(default_factory=deque)
    due_at: float | None = None
    given_up: bool = False


class Supervisor:
    def __init__(self, policy: RestartPolicy | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self._records: dict[str, _Record] = {}

    def exited(self, name: str, returncode: int) -> tuple[str, float | None]:
        """Record an exit; returns (what to log, seconds until the restart or None when given up)."""
        rec = self._records.setdefault(name, _Record())
        now = self.clock()
        while rec.restarts and rec.restarts[0] < now - self.policy.window_s:
            rec.restarts.popleft()
        cause = exit_cause(returncode)
        if len(rec.restarts) >= self.policy.max_restarts:
            rec.given_up, rec.due_at = True, None
            return (f"{name} exited ({cause}); not restarting it: {len(rec.restarts)} restarts within "
                    f"{self.policy.window_s:.0f} s reach the limit; see its log"), None
        delay = min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** len(rec.restarts))
        rec.due_at = now + delay
        return f"{name} exited ({cause}); restarting it in {delay:.1f} s", delay

    def due(self) -> list[str]:
        """Processes whose restart time has come (each returned once; call `started` after spawning)."""
        now = self.clock()
        out = [n for n, r in self._records.items() if r.due_at is not None and r.due_at <= now]
        for n in out:
            rec = self._records[n]
            rec.due_at = None
            rec.restarts.append(now)
        return out

    def waiting(self, name: str) -> bool:
        rec = self._records.get(name)
        return rec is not None and (rec.due_at is not None or rec.given_up)

    def given_up(self, name: str) -> bool:
        rec = self._records.get(name)
        return rec is not None and rec.given_up

    def restarts(self, name: str) -> int:
        rec = self._records.get(name)
        return len(rec.restarts) if rec else 0
