"""The coordinator's end of the reply links (coordinator/protocol/link_wire.py): LLM workers write their token
events here instead of to the reply stream; each frame's events go to their flights exactly as the reply stream's
do (replies.py)."""

from __future__ import annotations

import logging

from coordinator.config import CoordinatorConfig
from coordinator.flights import FlightBook
from coordinator.protocol.addresses import advertised, may_listen_unauthenticated
from coordinator.protocol.link_listener import LinkListener
from coordinator.protocol.streams import parse_event_list

log = logging.getLogger(__name__)


def route_frames(book: FlightBook, on_frame=lambda path: None):
    """`take` for the reply listener: a frame's events to their flights; one that cannot be routed is logged."""

    def take(body: bytes) -> None:
        events = parse_event_list(body)
        for ev in events:
            try:
                book.route(ev)
            except Exception as e:  # one event must not stop the link (as on the stream, replies.py)
                log.error("dropping a reply event that could not be routed",
                          extra={"request_id": ev.request_id, "error": str(e)})
        on_frame("direct")

    return take


async def open_listener(config: CoordinatorConfig, book: FlightBook, reply_key: str, secret: bytes | None,
                        on_frame=lambda path: None) -> LinkListener | None:
    """The coordinator's reply listener as `config` asks (direct_links, reply_host, reply_port), or None with the
    reason logged: off, or no cluster secret for a listener other hosts can reach."""
    if not config.direct_links:
        return None
    advertise = advertised(config.host, config.reply_host)
    if secret is None and not may_listen_unauthenticated(config.host, advertise):
        log.warning("no direct reply links: listening off loopback needs the cluster secret (set "
                    "TIERSERVE_CLUSTER_SECRET for the coordinator and every worker); tokens go through Redis alone")
        return None
    listener = LinkListener(reply_key, secret, route_frames(book, on_frame))
    await listener.start(config.host, config.reply_port, advertise)
    log.info("reply links listening", extra={"address": listener.address, "authenticated": secret is not None})
    return listener
