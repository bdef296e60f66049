"""The coordinator's reply stream: every worker appends the TokenEvents of this coordinator's requests to
one Redis stream (job.reply_to), and one task reads it with a blocking XREAD and hands each event to its
request. One connection and one blocking read serve every request in flight (no read per request), and
what was read is trimmed away, in the next read's round trip."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from coordinator.flights import FlightBook
from coordinator.protocol.process import honour_cancel
from coordinator.protocol.streams import parse_token_events

log = logging.getLogger(__name__)
BLOCK_MS = 1000
BATCH = 1024


async def read_replies(redis: Redis, key: str, book: FlightBook, backoff_s: float = 0.25,
                       on_frame=lambda path: None) -> None:
    """Forever: route each event on `key` to its flight; survives Redis restarts (read again from where it was;
    a restarted Redis numbers new entries after the old ones, from its clock). `on_frame("stream")` per entry.
    Workers with a direct reply link up write here only what the link could not take (reply_listener.py)."""
    last = "0-0"
    trim: str | None = None
    """The last entry read and routed: the next read's round trip trims up to it."""
    failing = False
    while True:
        try:
            if trim is None:
                resp = await redis.xread({key: last}, count=BATCH, block=BLOCK_MS)
            else:  # one round trip, not two: trimming what was routed costs no extra wait on Redis
                pipe = redis.pipeline(transaction=False)
                pipe.xtrim(key, minid=trim, approximate=True)
                pipe.xread({key: last}, count=BATCH, block=BLOCK_MS)
                resp = (await pipe.execute())[1]
                trim = None
            for _key, entries in resp or []:
                for entry_id, fields in entries:
                    last = entry_id
                    try:
                        events = parse_token_events(fields)
                    except Exception as e:  # a malformed entry must not stop every request's relay
                        log.error("dropping malformed reply", extra={"entry": str(entry_id), "error": str(e)})
                        continue
                    on_frame("stream")
                    for ev in events:
                        try:
                            book.route(ev)
                        except Exception as e:  # nor one event another request's
                            log.error("dropping a reply event that could not be routed",
                                      extra={"entry": str(entry_id), "request_id": ev.request_id, "error": str(e)})
                if entries:
                    trim = last
            if failing:
                log.info("reply stream readable again")
                failing = False
        except asyncio.CancelledError:
            raise
        except Exception as e:
            honour_cancel()
            if not failing:
                log.warning("reply stream unreadable; retrying", extra={"error": str(e)})
            failing = True
            await asyncio.sleep(backoff_s)
