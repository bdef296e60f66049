"""The requests one coordinator has in flight: where each is now, what reached its client, which run counts.

A `Flight` is the coordinator's memory of one request: its inputs (to run it again), the worker holding it
(`holder`, moved by hand-off events), the tokens already accepted for its client, and its attempt. The reply
reader (replies.py) feeds it the request's events; events of a superseded attempt are dropped, so when the
coordinator re-runs a request (failover.py) the client sees every token exactly once: the new run
continues after the tokens accepted so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from coordinator.protocol.messages import Holder, MediaRef, SamplingParams, TokenEvent


class RelayTimeout(TimeoutError):
    pass


GAP_WAIT_S = 1.0
"""How long events that skipped some tokens wait for them before the request is re-run from what its client has
(tokens lost with Redis): far above the milliseconds by which a stream write trails a direct link's frame."""


@dataclass
class Flight:
    request_id: str
    prompt_token_ids: list[int]
    """Empty while `prompt_key` is set (the prompt is being built beside the first encode job)."""
    sampling: SamplingParams
    media: list[MediaRef]
    """The request's stored media (empty for text-only): a re-run encodes them again."""
    received: float
    """time.time() at arrival."""
    inline: list[bytes] | None = field(default=None, repr=False)
    """The media's bytes, for the first run's encode job to carry (messages.INLINE_MEDIA_MAX_BYTES); dropped
    once that job is on its way, so a re-run reads them by key."""
    prompt_key: str | None = None
    """Set while the prompt is still being built beside its first encode job (coordinator/prompt_ahead.py): where
    that job's encode worker will find it. The failover leaves such a flight alone until it is built."""
    attempt: int = 0
    holder: Holder | None = None
    holder_since: float = 0.0
    """time.monotonic() when `holder` was set: a liveness view taken before it says nothing about it."""
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens accepted for the client, in order (what a re-run continues after)."""
    lost_holders: list[str] = field(default_factory=list)
    """Workers that died (or left) holding this request, oldest first."""
    done: bool = False
    unavailable: bool = False
    """It failed because no worker could finish it (answered 503), not because of a worker's error."""
    rerunning: bool = False
    broken: bool = False
    """Its events skipped some tokens (lost with Redis): it needs a re-run from what the client has."""
    ahead: dict[int, TokenEvent] = field(default_factory=dict, repr=False)
    """Events that came before the ones they follow, by index: a worker's events may take two ways (its direct
    reply link and the reply stream, link_wire.py), so one may overtake another by a few milliseconds."""
    gap_since: float | None = None
    """time.monotonic() since when `ahead` has waited for a missing event; past GAP_WAIT_S the flight is broken."""
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)

    def encode_media(self) -> list[MediaRef]:
        """The media as the next encode job names them: with their bytes inline while the first run has them."""
        if self.inline is None or self.attempt > 0:
            return self.media
        return [ref.model_copy(update={"data": raw}) for ref, raw in zip(self.media, self.inline, strict=True)]

    def hold(self, holder: Holder) -> None:
        self.holder, self.holder_since = holder, time.monotonic()

    def accept(self, ev: TokenEvent) -> None:
        """An event off the reply stream: a hand-off moves the holder; tokens and the end go to the client."""
        if self.done or ev.attempt != self.attempt:
            return
        if ev.holder is not None:
            self.hold(ev.holder)
            return
        if self.broken:
            return
        if ev.index > len(self.output_token_ids):  # tokens in between are still on their way, or lost
            self.ahead.setdefault(ev.index, ev)
            if self.gap_since is None:
                self.gap_since = time.monotonic()
            return
        self._take(ev)
        while self.ahead and not self.done:  # what waited for it, and any repeat it made stale
            index = min(self.ahead)
            if index > len(self.output_token_ids):
                break
            self._take(self.ahead.pop(index))
        if not self.ahead or self.done:
            self.ahead.clear()
            self.gap_since = None

    def gap_overdue(self, now: float) -> bool:
        """True once events have waited past GAP_WAIT_S for one that never came: marks the flight broken."""
        if self.gap_since is not None and now - self.gap_since > GAP_WAIT_S and not self.done:
            self.broken = True
        return self.broken

    def restart(self) -> None:
        """A re-run begins: what waited for the old run's missing events goes."""
        self.broken, self.gap_since = False, None
        self.ahead.clear()

    def _take(self, ev: TokenEvent) -> None:
        have = len(self.output_token_ids)
        if ev.token_ids and ev.index < have:  # a repeat of tokens already accepted (a write that came both ways)
            skip = have - ev.index
            if skip >= len(ev.token_ids) and ev.finish_reason is None:
                return
            ev = ev.model_copy(update={"token_ids": ev.token_ids[skip:], "text": "", "index": have,
                                       "logprobs": ev.logprobs.tail(skip) if ev.logprobs else None})
        self.output_token_ids += ev.token_ids
        if ev.finish_reason is not None:
            self.done = True
        self.events.put_nowait(ev)

    def fail(self, message: str, unavailable: bool = True) -> None:
        """End the request with an explicit error (the client's answer says `message`)."""
        if self.done:
            return
        self.done, self.unavailable = True, unavailable
        self.events.put_nowait(TokenEvent(request_id=self.request_id, attempt=self.attempt, finish_reason="error",
                                          error=message))

    async def stream(self, timeout_s: float) -> AsyncIterator[TokenEvent]:
        """The client's events in order, up to the one with a finish_reason; RelayTimeout past the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RelayTimeout(f"no final token within {timeout_s:.0f} s")
            if not self.events.empty():  # the common case under load: no wait, no timer
                ev = self.events.get_nowait()
            else:
                try:  # asyncio.timeout, not wait_for: wait_for (3.11) makes a task per call, i.e. per event
                    async with asyncio.timeout(remaining):
                        ev = await self.events.get()
                except TimeoutError:
                    raise RelayTimeout(f"no final token within {timeout_s:.0f} s") from None
            yield ev
            if ev.finish_reason is not None:
                return


class FlightBook:
    """Every request in flight on this coordinator, by id."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def add(self, flight: Flight) -> None:
        self._flights[flight.request_id] = flight

    def remove(self, request_id: str) -> None:
        self._flights.pop(request_id, None)

    def get(self, request_id: str) -> Flight | None:
        return self._flights.get(request_id)

    def route(self, ev: TokenEvent) -> None:
        flight = self._flights.get(ev.request_id)
        if flight is not None:
            flight.accept(ev)

    def __iter__(self):
        return iter(list(self._flights.values()))

    def __len__(self) -> int:
        return len(self._flights)
