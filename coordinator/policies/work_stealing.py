"""Cross-type work stealing (HeteroServe): an encode GPU runs language work while its encoder is idle.

The encode GPU also holds the LLM's weights in a small combined (prefill+decode) engine. After
encoding a micro-batch the encode worker asks `should_keep` for each request: keep it and serve it
entirely on this GPU, or send its embeddings to a remote LLM worker as usual. The engine may run one
step (one batched prefill or decode forward) only when `may_step` holds, and is asked between steps:

    if policy.may_step(now): run ONE step of the local engine
    elif an encode micro-batch waits: encode it
    else: sleep until the next event

`may_step` is False whenever an encode micro-batch waits, and the loop only asks between steps, so an
arriving batch waits for at most the one engine step already running: encoding is never delayed by
more than one step of stolen work (tests/coordinator/test_work_stealing.py checks this on a long
random timeline). The simulator runs this loop as written. Live, the engine is a separate process on
the same GPU and the same rule is enforced through a shared lock (coordinator/protocol/colocation.py,
encode_node/gpu_share.py, llm_node/gpu_share.py); the live runtime reports the engine's load with
`observe_local_load` instead of `finished`, since completions happen in that other process.

Taking a request (`should_keep`) needs all of:
- `enabled`;
- no encode micro-batch waiting, and none for at least `quiet_s`. "Waiting" excludes the batch being
  encoded, because the decision is taken right after encoding: counting that batch would make any
  quiet_s > 0 refuse every request. So quiet_s is a burst detector: a request from the middle of a
  burst (a batch was queued behind it less than quiet_s ago) is never kept;
- fewer than `max_stolen` stolen requests in flight locally;
- the least-loaded remote LLM worker holds at least `remote_load_threshold` requests: stealing from
  an idle datacenter GPU only makes the request slower. When NO remote worker is alive
  (`observe_remote_load(None, ...)`) the threshold is waived: the local engine is then the only way
  to serve, and the other rules still keep encoding first. Disabled still means never.
Until the encode queue and the remote load have each been observed once, nothing is kept: stealing
is an optimisation, never a guess.

Disabled, the policy keeps nothing, but requests already taken still get steps so they can finish.
No clock and no I/O: every time is the caller's `now`.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class WorkStealingConfig(BaseModel):
    """Knobs of work stealing on one encode worker (plan file / admin endpoint)."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = False
    """Whether this encode worker may keep requests for its local engine at all."""
    max_stolen: int = Field(4, ge=1)
    """The most stolen requests in flight in the local engine at once (bounds its batch and KV memory)."""
    remote_load_threshold: int = Field(1, ge=0)
    """Steal only when the least-loaded remote LLM worker already holds at least this many requests;
    0 steals even from an idle remote worker. Waived when no remote worker is alive."""
    quiet_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    """No encode micro-batch may have been waiting for at least this long before new language work is
    taken (the batch being encoded does not count as waiting)."""


_UNSEEN = object()
"""Remote load not observed yet; distinct from None (observed: no remote worker alive)."""


class WorkStealing:
    """Decide which requests an encode worker keeps, and when its local engine may step; see the module."""

    def __init__(self, config: WorkStealingConfig | None = None) -> None:
        self.config = config or WorkStealingConfig()
        self._pending = 0
        """Encode micro-batches waiting (not the one being encoded), as last observed."""
        self._quiet_since: float | None = None
        """When the encode queue last became empty; None while a batch waits or before any observation."""
        self._min_remote_load: object = _UNSEEN
        self._in_flight: set[str] = set()
        self._observed_held: int | None = None
        """The local engine's own count of requests it holds (live runtime); None = count ids instead."""
        self._started_since_observed = 0
        self._total = 0
        self._seconds = 0.0
        self._longest_step = 0.0

    def observe_encode_queue(self, pending_batches: int, now: float) -> None:
        """The number of encode micro-batches waiting changed (one released, or one taken to encode)."""
        if pending_batches < 0:
            raise ValueError(f"pending_batches must be >= 0, got pending_batches={pending_batches!r}")
        if pending_batches > 0:
            self._quiet_since = None
        elif self._pending > 0 or self._quiet_since is None:
            self._quiet_since = now
        self._pending = pending_batches

    def observe_remote_load(self, min_remote_load: int | None, now: float) -> None:
        """Requests held by the least-loaded live remote LLM worker; None if no remote worker is alive."""
        if min_remote_load is not None and min_remote_load < 0:
            raise ValueError(f"min_remote_load must be >= 0 or None, got min_remote_load={min_remote_load!r}")
        self._min_remote_load = min_remote_load

    def observe_local_load(self, held: int, now: float) -> None:
        """The local engine holds `held` requests (queued for it or running). The live runtime reports
        this instead of calling `finished`: completions happen in another process. Kept requests are
        counted on top until the next observation, so a batch cannot overshoot `max_stolen`."""
        if held < 0:
            raise ValueError(f"held must be >= 0, got held={held!r}")
        self._observed_held = held
        self._started_since_observed = 0

    def _held(self) -> int:
        if self._observed_held is None:
            return len(self._in_flight)
        return self._observed_held + self._started_since_observed

    def should_keep(self, now: float) -> bool:
        """Keep the request just encoded and serve it locally? Call `started` at once if so, before
        asking about the next request of the batch. Asking changes nothing."""
        cfg = self.config
        if not cfg.enabled or self._pending > 0 or self._quiet_since is None:
            return False
        if now - self._quiet_since < cfg.quiet_s or self._held() >= cfg.max_stolen:
            return False
        load = self._min_remote_load
        if load is _UNSEEN:
            return False
        return load is None or load >= cfg.remote_load_threshold

    def started(self, request_id: str, now: float) -> None:
        """The runtime kept `request_id` for its local engine."""
        if self._observed_held is not None:
            self._started_since_observed += 1
        elif request_id in self._in_flight:
            raise ValueError(f"stolen request {request_id!r} is already in flight")
        else:
            self._in_flight.add(request_id)
        self._total += 1

    def finished(self, request_id: str, now: float) -> None:
        """A kept request left the local engine (completed or aborted); once per `started`."""
        try:
            self._in_flight.remove(request_id)
        except KeyError:
            raise ValueError(f"request {request_id!r} is not a stolen request in flight") from None

    def may_step(self, now: float) -> bool:
        """May the local engine run one step now? Never while an encode micro-batch waits (the encoder
        goes first), and only with stolen work to advance. Ask before every step."""
        return self._pending == 0 and self._held() > 0

    def record_step(self, seconds: float, now: float) -> None:
        """One local engine step of stolen work took `seconds` (for metrics and the delay bound)."""
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"step seconds must be finite and >= 0, got seconds={seconds!r}")
        self._seconds += seconds
        self._longest_step = max(self._longest_step, seconds)

    @property
    def stolen_in_flight(self) -> int:
        """Kept requests not yet finished (as last observed, in the live runtime)."""
        return self._held()

    @property
    def stolen_total(self) -> int:
        """Requests kept since construction."""
        return self._total

    @property
    def stolen_seconds(self) -> float:
        """Local engine time spent on stolen work since construction (sum of recorded steps)."""
        return self._seconds

    @property
    def longest_step_s(self) -> float:
        """The longest recorded step: the worst delay stolen work can have added to an encode batch."""
        return self._longest_step
