"""The failover and a request whose prompt is still being built beside its first encode job (prompt_ahead.py): a
re-run needs the prompt, so the real coordinator's failover leaves the flight alone until it is built, then
re-runs it (here: no worker is alive, so it ends with an explicit error)."""

from __future__ import annotations

import asyncio
import time

import pytest
from live_app import app_client

from coordinator.flights import Flight
from coordinator.protocol.messages import Holder, MediaRef, SamplingParams

pytestmark = pytest.mark.redis


async def test_a_flight_is_rerun_only_once_its_prompt_is_built(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix) as (app, _):
        state = app.state.tierserve
        flight = Flight("r-pending", [], SamplingParams(), [MediaRef(key=state.keys.media("r-pending", 0))],
                        time.time(), prompt_key=state.keys.prompt("r-pending"))
        flight.hold(Holder(worker_id="encode-gone", instance="dead"))  # never registered: gone at once
        state.flights.add(flight)
        await asyncio.sleep(1.0)  # four failover checks
        pending = (flight.done, flight.attempt, flight.rerunning)
        flight.prompt_token_ids, flight.prompt_key = [1, 2, 3], None
        deadline = time.monotonic() + 5
        while not flight.done and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        state.flights.remove("r-pending")
    assert pending == (False, 0, False)
    assert flight.done and flight.lost_holders == ["encode-gone"]
    assert "encode-gone" in flight.events.get_nowait().error
