"""Where the time to first token goes, live and simulated, in the same stages.

A fidelity miss on TTFT says the simulator is wrong, not where. Both sides mark the same events: the
live coordinator's per-hop marks (replay.ReplayRecord.marks, seconds since it received the request) and
the simulator's RequestRecord times. The stages are cut at those shared events:

  to_encode       arrival -> the encoder forward that includes the request starts (prompt building,
                  dispatch, queueing behind earlier batches)
  encode          that forward
  to_first_token  encoder end -> the first token exists (transfer, admission, waiting for and running
                  the prefill step)
  to_client       the first token -> the client reads it, plus the request's way in before the
                  coordinator's mark (simulated: the stack's way out, sim_stack.py)

Means, so that the stages add up to the mean TTFT; one stage's error then is its share of the miss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from coordinator.planner.goodput import RequestRecord
from coordinator.planner.replay import ReplayRecord

STAGES = ("to_encode", "encode", "to_first_token", "to_client")
LIVE_MARKS = ("encode_start", "encode_end", "first_token")
"""The coordinator's marks a live record needs for a breakdown."""


def _means(rows: list[tuple[float, ...]]) -> dict[str, float]:
    if not rows:
        return {}
    return {name: sum(r[i] for r in rows) / len(rows) for i, name in enumerate(STAGES)} | {"requests": len(rows)}


def live_stages(records: Iterable[ReplayRecord]) -> dict[str, float]:
    """Mean seconds per stage over the finished requests that carry the marks; {} when none do (a server
    that sends no `tierserve` record)."""
    rows = []
    for r in records:
        if not r.ok or any(k not in r.marks for k in LIVE_MARKS):
            continue
        m = r.marks
        rows.append((m["encode_start"], m["encode_end"] - m["encode_start"], m["first_token"] - m["encode_end"],
                     r.ttft - m["first_token"]))
    return _means(rows)


def sim_stages(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Mean seconds per stage over the simulated requests that got a first token."""
    rows = [(r.encode_start - r.request.arrival, r.encode_end - r.encode_start,
             r.first_token - r.to_client - r.encode_end, r.to_client)
            for r in records if not math.isnan(r.first_token) and not math.isnan(r.encode_end)]
    return _means(rows)
