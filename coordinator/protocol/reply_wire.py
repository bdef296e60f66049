"""The direct reply link's wire: how an LLM worker hands a coordinator its token events over TCP, beside Redis.

Redis carries the events too (the coordinator's reply stream, streams.py); the link only takes one process hop
off the first token's way out (worker -> Redis -> coordinator becomes worker -> coordinator: ~0.5 ms against
~1.0-1.4 ms on the 2-core CPU host, `benchmarks/results/bench-vllm-fast-host/trials21/`), as vLLM's engine hands
its API server outputs over ZMQ and Dynamo's workers stream responses back to the frontend over TCP.

One connection per (worker process, coordinator process):

    coordinator -> worker   HELLO_MAGIC, a 16-byte nonce
    worker -> coordinator   a frame (seq 0) whose body is a Hello (JSON)
    coordinator -> worker   an ack of seq 0 (accepted) or a frame whose body is the refusal (text), then EOF
    worker -> coordinator   frames: HEADER (body length, seq), the body: one reply-stream entry's JSON (a list
                            of TokenEvents, streams.py), seq 1, 2, ...
    coordinator -> worker   ACK (the highest seq it has routed), after each read

What makes it as safe as the stream: with a cluster secret the hello carries an HMAC over the nonce, the worker
and the reply stream it serves, so only a holder of the secret can put events on a coordinator (without a secret
the coordinator listens on a loopback address only). A frame the coordinator has not acked when the link breaks
or stalls is written to the reply stream instead, and so is everything after it until a new link is up; token
events carry their index, so a frame that arrives both ways is taken once (flights.Flight.accept). Bodies are
JSON, never pickle, and bounded (MAX_FRAME_BYTES).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from pydantic import BaseModel, ConfigDict, Field

HELLO_MAGIC = b"TSRL1\n"
"""Version tag the coordinator sends first: a worker that speaks another version stops at once."""
NONCE_BYTES = 16
HEADER = struct.Struct("!IQ")
"""A frame's head: its body's length in bytes, its sequence number."""
ACK = struct.Struct("!Q")
MAX_FRAME_BYTES = 32 << 20
"""Largest body accepted: far above a step's events (a 256-sequence step with logits is a few MiB)."""
MAX_HELLO_BYTES = 4096
HELLO_TIMEOUT_S = 5.0
"""A connection that has not said hello by then is closed (it holds a slot for nothing)."""
_DOMAIN = b"tierserve-reply-link/1\0"
"""Prefix of the hello's MAC, so a tag made for anything else with the same secret never verifies here."""


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str = Field(max_length=256)
    reply_key: str = Field(max_length=512)
    """The reply stream the link stands in for: a coordinator refuses a link meant for another process (one
    restarted on the same port) rather than take events for requests it never had."""
    mac: str = Field("", max_length=128)
    """Hex HMAC-SHA256 (hello_mac); empty without a cluster secret."""


def hello_mac(secret: bytes, nonce: bytes, worker_id: str, reply_key: str) -> str:
    return hmac.new(secret, b"\0".join([_DOMAIN, nonce, worker_id.encode(), reply_key.encode()]),
                    hashlib.sha256).hexdigest()


def check_hello(hello: Hello, secret: bytes | None, nonce: bytes, reply_key: str) -> str | None:
    """Why the coordinator refuses this hello, or None to accept it."""
    if hello.reply_key != reply_key:
        return (f"this coordinator serves reply stream {reply_key}, not {hello.reply_key} (did it restart?); "
                "the worker writes those events to Redis")
    if secret is None:
        return None
    if not hello.mac:
        return "this coordinator needs the cluster secret: set TIERSERVE_CLUSTER_SECRET for every worker"
    if not hmac.compare_digest(hello_mac(secret, nonce, hello.worker_id, reply_key), hello.mac):
        return "wrong authentication tag: is the worker of this cluster, with the same TIERSERVE_CLUSTER_SECRET?"
    return None


def frame(seq: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), seq) + body


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"reply address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
