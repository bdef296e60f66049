"""The monitor's view of the request path: a FlightBook that reports arrivals and endings to it.

The coordinator's FlightBook already sees every request arrive (`add`), every token event (`route`) and
every request leave (`remove`, whatever its outcome), so watching it gives the monitor exact per-request
TTFT and TPOT without touching the chat route. Time is the monitor's injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.flights import Flight, FlightBook
from coordinator.oserve.monitor import WorkloadMonitor
from coordinator.protocol.messages import TokenEvent


@dataclass
class _Seen:
    received: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    error: bool = False


class MonitoredFlightBook(FlightBook):
    """A FlightBook whose arrivals and endings are counted by `monitor`."""

    def __init__(self, monitor: WorkloadMonitor) -> None:
        super().__init__()
        self.monitor = monitor
        self._seen: dict[str, _Seen] = {}

    def add(self, flight: Flight) -> None:
        super().add(flight)
        modality = flight.media[0].kind if flight.media else "text"
        self._seen[flight.request_id] = _Seen(self.monitor.clock())
        self.monitor.arrived(modality, len(flight.media), len(flight.prompt_token_ids))

    def route(self, ev: TokenEvent) -> None:
        flight, seen = self.get(ev.request_id), self._seen.get(ev.request_id)
        if flight is not None and seen is not None and ev.attempt == flight.attempt and ev.holder is None:
            if ev.token_ids:
                now = self.monitor.clock()
                seen.first = seen.first if seen.first is not None else now
                seen.last, seen.tokens = now, seen.tokens + len(ev.token_ids)
            seen.error |= ev.finish_reason == "error"
        super().route(ev)

    def remove(self, request_id: str) -> None:
        flight, seen = self.get(request_id), self._seen.pop(request_id, None)
        super().remove(request_id)
        if flight is None or seen is None:
            return
        ok = flight.done and not flight.unavailable and not seen.error
        ttft = seen.first - seen.received if seen.first is not None else None
        tpot = (seen.last - seen.first) / (seen.tokens - 1) if seen.first is not None and seen.tokens > 1 else None
        self.monitor.finished(ok, ttft, tpot, len(flight.output_token_ids))
