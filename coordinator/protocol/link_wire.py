"""Direct links: one process hands another the entries it would append to a Redis stream over TCP instead, the
stream standing in whenever no link is up. Two kinds exist:

- reply links: an LLM worker writes its token events to its coordinator (the coordinator's reply stream,
  streams.py; coordinator/reply_listener.py), as vLLM's engine hands its API server outputs over ZMQ and Dynamo's
  workers stream responses back to the frontend over TCP;
- job links: the coordinator writes the micro-batches its dispatch policy released to an encode worker (the
  worker's job stream; encode_node/job_inbox.py).

Each takes one process hop off a request's way (writer -> Redis -> reader becomes writer -> reader: ~0.5 ms
against ~1.0-1.4 ms on the 2-core CPU host, `benchmarks/results/bench-vllm-fast-host/trials21/thop.py`).

One connection per (writer process, stream); the reader listens:

    reader -> writer   HELLO_MAGIC, a 16-byte nonce
    writer -> reader   a frame (seq 0) whose body is a Hello (JSON)
    reader -> writer   a frame (seq 0): empty when accepted, else the refusal (text), then EOF
    writer -> reader   frames: HEADER (body length, seq), the body: one stream entry's value, seq 1, 2, ...
    reader -> writer   ACK (the highest seq it has taken), after each frame

What makes a link as safe as the stream: with a cluster secret the hello carries an HMAC over the nonce, the
writer and the stream it stands in for, so only a holder of the secret can write (without a secret a link listens
on a loopback address only). Frames not acked when a link breaks or stalls are appended to the stream instead, and
so is everything after them until a new link is up (links.py); the reader takes an entry that came both ways once
(token events by their index, flights.py; encode jobs by request and attempt, encode_node/job_inbox.py). Bodies
are JSON, never pickle, and bounded (MAX_FRAME_BYTES).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from pydantic import BaseModel, ConfigDict, Field

HELLO_MAGIC = b"TSLK1\n"
"""Version tag the reader sends first: a writer that speaks another version stops at once."""
NONCE_BYTES = 16
HEADER = struct.Struct("!IQ")
"""A frame's head: its body's length in bytes, its sequence number."""
ACK = struct.Struct("!Q")
MAX_FRAME_BYTES = 32 << 20
"""Largest body accepted: far above a step's events (a 256-sequence step with logits is a few MiB) or a
micro-batch's jobs (inline media: at most 512 KiB a request, messages.INLINE_MEDIA_MAX_BYTES)."""
MAX_HELLO_BYTES = 4096
HELLO_TIMEOUT_S = 5.0
"""A connection that has not said hello by then is closed (it holds a slot for nothing)."""
_DOMAIN = b"tierserve-link/1\0"
"""Prefix of the hello's MAC, so a tag made for anything else with the same secret never verifies here."""


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid")

    writer: str = Field(max_length=256)
    """Who writes (a worker id, or a coordinator's reply stream), for the reader's logs."""
    stream: str = Field(max_length=512)
    """The stream the link stands in for: a reader refuses a link meant for another process (one restarted on the
    same port) rather than take entries it would misread."""
    mac: str = Field("", max_length=128)
    """Hex HMAC-SHA256 (hello_mac); empty without a cluster secret."""


def hello_mac(secret: bytes, nonce: bytes, writer: str, stream: str) -> str:
    return hmac.new(secret, b"\0".join([_DOMAIN, nonce, writer.encode(), stream.encode()]), hashlib.sha256).hexdigest()


def check_hello(hello: Hello, secret: bytes | None, nonce: bytes, stream: str) -> str | None:
    """Why the reader refuses this hello, or None to accept it."""
    if hello.stream != stream:
        return (f"this link stands in for stream {stream}, not {hello.stream} (did its process restart?); "
                "the writer appends to the stream instead")
    if secret is None:
        return None
    if not hello.mac:
        return "this link needs the cluster secret: set TIERSERVE_CLUSTER_SECRET for every process of the cluster"
    if not hmac.compare_digest(hello_mac(secret, nonce, hello.writer, stream), hello.mac):
        return "wrong authentication tag: is the writer of this cluster, with the same TIERSERVE_CLUSTER_SECRET?"
    return None


def frame(seq: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), seq) + body
