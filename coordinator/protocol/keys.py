"""The Redis key schema, in one place (documented in coordinator/README.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """All keys live under one prefix so a test run or a second cluster can share a Redis."""

    prefix: str = "tierserve"

    @property
    def workers(self) -> str:
        """Hash: worker_id -> WorkerInfo JSON."""
        return f"{self.prefix}:workers"

    def heartbeat(self, worker_id: str) -> str:
        """String with a TTL; the worker is alive while it exists."""
        return f"{self.prefix}:hb:{worker_id}"

    def load(self, worker_id: str) -> str:
        """String (JSON): the worker's in-flight request count and policy stats, sent with each heartbeat."""
        return f"{self.prefix}:load:{worker_id}"

    def jobs(self, worker_id: str) -> str:
        """Stream of Job messages for one worker."""
        return f"{self.prefix}:jobs:{worker_id}"

    def tokens(self, request_id: str) -> str:
        """Stream of TokenEvent messages for one request (TTL'd after the request ends)."""
        return f"{self.prefix}:tok:{request_id}"

    def media(self, request_id: str, index: int) -> str:
        """Raw media bytes of one request part (TTL'd)."""
        return f"{self.prefix}:media:{request_id}:{index}"

    @property
    def aborts(self) -> str:
        """Pub/sub channel: request ids whose client went away."""
        return f"{self.prefix}:aborts"

    @property
    def encoder_idle(self) -> str:
        """Pub/sub channel: encode worker ids whose job stream just ran empty (work-conserving dispatch)."""
        return f"{self.prefix}:encoder-idle"

    @property
    def policy(self) -> str:
        """String: the policy knobs in force (JSON), as last set at start or through the admin endpoint."""
        return f"{self.prefix}:policy"
