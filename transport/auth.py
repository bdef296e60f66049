"""Who may hand a receiver tensors: a peer that knows the cluster's secret, for this receiver, just now.

With a secret set, every transfer carries a Stamp: an HMAC-SHA256 over what it announces (the descriptors:
request id, names, dtypes, shapes, byte sizes, CRC32 when present; for nixl also the pool blocks, or the
sender's metadata), over which receiver it is for (a digest of the receiver's published address), when it
was issued and a random nonce. The receiver checks it before it takes any payload byte or grants any
memory: a missing or wrong tag, a tag for another receiver, one issued more than `max_age_s` ago (or
further than `skew_s` ahead of this clock) and a nonce seen before are refused. The secret itself never
travels. The stamp does not cover the payload bytes: tcp and local check them against the CRC32 it
covers; ucx and nixl check them against the CRC32 the engine claims them with (from the control plane).

Without a secret (the default) nothing is checked: anyone who can reach a receiver can hand it tensors.
That is for a single trusted host only; `transport` reads no environment, so the worker passes the
secret (coordinator/protocol/envs.py: TIERSERVE_CLUSTER_SECRET or TIERSERVE_CLUSTER_SECRET_FILE).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from transport.admission import Refused
from transport.wire import TensorDescriptor

_DOMAIN = b"tierserve-transport/1\0"
"""Prefix of every MAC'd message, so a tag made for something else with the same secret never verifies here."""


class Stamp(BaseModel):
    """The authentication a transfer carries when the cluster has a secret (JSON, beside the descriptors)."""

    model_config = ConfigDict(frozen=True)

    to: str = Field(max_length=64)
    """Digest of the receiver's published address (`address_tag`): the receiver this transfer is for."""
    issued_ms: int = Field(ge=0)
    """Sender's wall clock (ms since the epoch) when it made the stamp; the receiver refuses old ones."""
    nonce: str = Field(max_length=64)
    """Random; the receiver refuses a nonce it has seen, so a captured transfer cannot be replayed."""
    mac: str = Field(max_length=128)
    """Hex HMAC-SHA256 over kind, to, issued_ms, nonce and the body."""


def address_tag(address: str) -> str:
    """A short, fixed-size name of a receiver address (ucx and nixl addresses are kilobytes long)."""
    return hashlib.sha256(address.encode()).hexdigest()[:32]


def descs_body(descs: Iterable[TensorDescriptor], *extra: object) -> bytes:
    """The canonical bytes of descriptors (and extra JSON-able fields) that a stamp covers; both ends build
    them from the parsed values, so no serialiser difference can make a genuine tag fail."""
    rows = [[d.request_id, d.name, d.dtype, list(d.shape), d.nbytes, d.checksum] for d in descs]
    return json.dumps([rows, *extra], separators=(",", ":")).encode()


def _mac(key: bytes, kind: str, to: str, issued_ms: int, nonce: str, body: bytes) -> str:
    head = b"\0".join([_DOMAIN, kind.encode(), to.encode(), str(issued_ms).encode(), nonce.encode()])
    return hmac.new(key, head + b"\0" + body, hashlib.sha256).hexdigest()


class Signer:
    """Stamps a sender's transfers. `clock` (seconds since the epoch) and `nonce` are injectable for tests."""

    def __init__(self, secret: bytes, *, clock: Callable[[], float] = time.time,
                 nonce: Callable[[], str] = lambda: secrets.token_hex(16)) -> None:
        if not secret:
            raise ValueError("an empty cluster secret authenticates nothing; pass None to run without one")
        self._key, self._clock, self._nonce = secret, clock, nonce
        self._tags: dict[str, str] = {}

    def stamp(self, kind: str, address: str, body: bytes) -> Stamp:
        to = self._tags.get(address) or self._tags.setdefault(address, address_tag(address))
        issued, nonce = int(self._clock() * 1000), self._nonce()
        return Stamp(to=to, issued_ms=issued, nonce=nonce, mac=_mac(self._key, kind, to, issued, nonce, body))


class Verifier:
    """Checks stamps for one receiver, remembering recent nonces (at most `max_nonces`) to refuse replays."""

    def __init__(self, secret: bytes, *, max_age_s: float = 30.0, skew_s: float = 5.0, max_nonces: int = 1 << 17,
                 clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("an empty cluster secret authenticates nothing; pass None to run without one")
        self._key, self._clock = secret, clock
        self.max_age_s = max_age_s
        """Oldest stamp accepted, in seconds: bounds how long a nonce must be remembered."""
        self.skew_s = skew_s
        """How far a sender's clock may run ahead of ours."""
        self.max_nonces = max_nonces
        self._seen: dict[str, int] = {}
        self._order: deque[tuple[int, str]] = deque()
        self._floor_ms = 0
        """Stamps issued at or before this are refused: their nonces may have been forgotten (a full memory)."""
        self._tag = ""

    def bind(self, address: str) -> None:
        """The address this receiver publishes (known once it started); stamps must name it."""
        self._tag = address_tag(address)

    def check(self, kind: str, stamp: Stamp | None, body: bytes, what: str) -> None:
        """Raise Refused (naming its counter) unless `stamp` is a fresh, unseen tag for this receiver."""
        if stamp is None:
            raise Refused("bad_mac", f"{what}: no authentication tag; this receiver needs the cluster secret "
                                     "(set TIERSERVE_CLUSTER_SECRET for every worker of the cluster)")
        good = _mac(self._key, kind, stamp.to, stamp.issued_ms, stamp.nonce, body)
        if not hmac.compare_digest(good, stamp.mac):
            raise Refused("bad_mac", f"{what}: wrong authentication tag; is the sender of this cluster, with the "
                                     "same TIERSERVE_CLUSTER_SECRET?")
        if stamp.to != self._tag:
            raise Refused("misaddressed", f"{what}: addressed to another receiver; the sender used a stale "
                                          "address (did the receiving worker restart?)")
        now_ms = int(self._clock() * 1000)
        age = (now_ms - stamp.issued_ms) / 1000
        if age > self.max_age_s or age < -self.skew_s or stamp.issued_ms <= self._floor_ms:
            raise Refused("stale", f"{what}: issued {age:.1f}s ago, accepted within {self.max_age_s}s (clock "
                                   f"skew {self.skew_s}s); are the hosts' clocks in sync (NTP)?")
        if stamp.nonce in self._seen:
            raise Refused("replay", f"{what}: this transfer was delivered before (a replay)")
        self._remember(stamp.nonce, stamp.issued_ms, now_ms)

    def _remember(self, nonce: str, issued_ms: int, now_ms: int) -> None:
        self._seen[nonce] = issued_ms
        self._order.append((issued_ms, nonce))
        horizon = now_ms - int((self.max_age_s + self.skew_s) * 1000)
        while self._order and (self._order[0][0] < horizon or len(self._order) > self.max_nonces):
            old, n = self._order.popleft()
            del self._seen[n]
            if old >= horizon:  # forgotten while still fresh: refuse everything that old from now on
                self._floor_ms = max(self._floor_ms, old)
