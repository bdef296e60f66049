"""The Redis key schema, in one place (documented in coordinator/README.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """All keys live under one prefix so a test run or a second cluster can share a Redis."""

    prefix: str = "tierserve"

    @property
    def workers(self) -> str:
        """Sorted set: worker_id -> wall-clock time of its last heartbeat (the registry's index)."""
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        """String (JSON WorkerRecord): the worker's info, load and stats, with a TTL every heartbeat renews;
        the worker is alive while it exists."""
        return f"{self.prefix}:worker:{worker_id}"

    def jobs(self, worker_id: str) -> str:
        """Stream of Job messages for one worker."""
        return f"{self.prefix}:jobs:{worker_id}"

    def tokens(self, request_id: str) -> str:
        """Stream of TokenEvent messages for one request (TTL'd after the request ends)."""
        return f"{self.prefix}:tok:{request_id}"

    def replies(self, coordinator_instance: str) -> str:
        """Stream of TokenEvent messages of every request one coordinator process relays (job.reply_to)."""
        return f"{self.prefix}:replies:{coordinator_instance}"

    @property
    def epoch(self) -> str:
        """String set by the coordinator at start; its absence means Redis lost its contents (a restart
        without persistence, or FLUSHALL)."""
        return f"{self.prefix}:epoch"

    def media(self, request_id: str, index: int) -> str:
        """Raw media bytes of one request part (TTL'd)."""
        return f"{self.prefix}:media:{request_id}:{index}"

    def prompt(self, request_id: str) -> str:
        """List (TTL'd) holding one PromptReady: the prompt of an encode job that left before it was built."""
        return f"{self.prefix}:prompt:{request_id}"

    @property
    def aborts(self) -> str:
        """Pub/sub channel: request ids whose client went away."""
        return f"{self.prefix}:aborts"

    @property
    def encoder_idle(self) -> str:
        """Pub/sub channel: encode worker ids whose job stream just ran empty (work-conserving dispatch)."""
        return f"{self.prefix}:encoder-idle"

    @property
    def warming(self) -> str:
        """Set of worker ids registered but not routed to yet (a plan switch starts a layout's workers warming and
        releases them together once all are up); the registry reports them as draining."""
        return f"{self.prefix}:warming"

    @property
    def policy(self) -> str:
        """String: the policy knobs in force (JSON), as last set at start or through the admin endpoint."""
        return f"{self.prefix}:policy"
