"""A NIXL agent whose UCX progress runs in NIXL's own thread, woken by UCX events, never by polling.

Why not NIXL's defaults: its Python wrapper starts the progress thread with a delay of 0, which makes the
thread's poll() return at once, i.e. spin (16 ms per transfer on 2 cores, measured). With the delay set
(it is only poll()'s timeout), the thread sleeps in poll() on UCX's event fd and runs the instant a
message or completion arrives, in C++, without the GIL. That is what makes one-sided WRITEs work without
the receiver's Python code running: its NIXL thread answers the wire-up and takes the notifications.
Our code calls the agent from the event loop (and, for big tensors, from a worker thread), so the agent
runs in NIXL's strict thread-safety mode.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import secrets
import time
from typing import Any

from transport.auth import descs_body
from transport.base import TransportError

_nixl: Any = None
PROGRESS_POLL_US = 100_000
"""Timeout of the NIXL progress thread's poll(); events wake it earlier, so this only bounds idle wake-ups."""
SPIN_S = 200e-6
"""How long a transfer's completion is awaited by yielding on the event loop before a thread waits for it."""


def _lib() -> Any:
    global _nixl  # the import is slow and optional: do it once, on first use
    if _nixl is None:
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        try:
            import nixl_cu12  # noqa: PLC0415
        except ImportError as e:
            raise TransportError(f"the nixl transport needs nixl: pip install --no-deps nixl-cu12==1.5.1 ({e})") from e
        # NIXL logs INFO lines to stdout, which belongs to the worker (and to JSON-line logs): keep warnings only.
        logging.getLogger("nixl").setLevel(os.environ.get("NIXL_LOG_LEVEL", "WARNING").upper())
        _nixl = nixl_cu12
    return _nixl


class NixlAgent:
    """One agent with the UCX backend; `agent` is the nixl_agent whose methods the backends call."""

    def __init__(self, role: str, *, error_handling: str = "peer") -> None:
        lib = _lib()
        from nixl_cu12 import _bindings  # noqa: PLC0415

        self.name = f"{role}-{os.getpid()}-{secrets.token_hex(4)}"
        agent = lib.nixl_agent(self.name, lib.nixl_agent_config(enable_prog_thread=True, backends=[]))
        config = _bindings.nixlAgentConfig()
        config.useProgThread, config.useListenThread = True, False
        config.syncMode = _bindings.NIXL_THREAD_SYNC_STRICT
        config.pthrDelay, config.lthrDelay = PROGRESS_POLL_US, PROGRESS_POLL_US
        # The wrapper hard-codes pthrDelay=0 (a spinning thread); swap in an agent built with the delay set
        # before any backend exists (nixl-cu12 1.5.1; the wrapper's other state does not depend on it).
        agent.agent = _bindings.nixlAgent(self.name, config)
        agent.create_backend("UCX", {"ucx_error_handling_mode": error_handling})
        self.agent = agent

    @property
    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def address(self) -> str:
        """What a receiver publishes: its name and metadata (memory keys included), so a sender needs no lookup."""
        info = {"name": self.name, "md": base64.b64encode(self.metadata).decode()}
        return "nixl://" + base64.urlsafe_b64encode(json.dumps(info).encode()).decode()

    def add_peer(self, metadata: bytes) -> str:
        name = self.agent.add_remote_agent(metadata)
        return name.decode() if isinstance(name, bytes) else name

    def forget(self, peer: str) -> None:
        try:
            self.agent.remove_remote_agent(peer)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def notifs(self) -> list[tuple[str, bytes]]:
        got = self.agent.get_new_notifs()
        return [(k.decode() if isinstance(k, bytes) else k, m) for k, msgs in got.items() for m in msgs]

    def register(self, runs: list[tuple[int, int]]) -> Any:
        """Register (address, length) runs of DRAM; returns the handle for `deregister`."""
        return self.agent.register_memory([(a, n, 0, "") for a, n in runs], "DRAM")

    def deregister(self, handle: Any) -> None:
        try:
            self.agent.deregister_memory(handle)
        except Exception:  # noqa: BLE001 - best effort: a failed transfer may have left it half torn down
            pass

    def write(self, peer: str, local: list[tuple[int, int]], remote: list[tuple[int, int]]) -> tuple[Any, str]:
        """Start one WRITE of (address, length) pairs. Returns the handle and its first state; over cma the
        copy happens inside this call ("DONE" unless the flush that follows it waits)."""
        handle = self.agent.initialize_xfer("WRITE", self.agent.get_xfer_descs([(a, n, 0) for a, n in local], "DRAM"),
                                            self.agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM"), peer)
        return handle, self.agent.transfer(handle)

    def settle(self, handle: Any, deadline: float, what: str) -> None:
        """Block this (worker) thread until the transfer is done (NIXL's thread completes it; we only look)."""
        state = self.agent.check_xfer_state(handle)
        while state == "PROC":
            if time.monotonic() > deadline:
                raise TransportError(f"{what}: not complete by its deadline; is the receiving worker alive?")
            time.sleep(20e-6)
            state = self.agent.check_xfer_state(handle)
        if state != "DONE":
            raise TransportError(f"{what}: NIXL reported {state}; is the receiving worker alive?")

    async def finish(self, handle: Any, state: str, deadline: float, what: str) -> None:
        """Await a transfer started on the event loop: yield a few times (a flush takes microseconds when
        the peer's NIXL thread is awake), then let a worker thread wait, so the loop never spins for long."""
        spin_until = time.monotonic() + SPIN_S
        while state == "PROC" and time.monotonic() < spin_until:
            await asyncio.sleep(0)
            state = self.agent.check_xfer_state(handle)
        if state == "PROC":
            await asyncio.to_thread(self.settle, handle, deadline, what)
        elif state != "DONE":
            raise TransportError(f"{what}: NIXL reported {state}; is the receiving worker alive?")

    def close(self) -> None:
        """Destroy the agent now (its progress thread stops, its memory registrations go), not at garbage
        collection; the caller keeps any registered memory alive that a late peer might still write to."""
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.agent = None

    def release(self, handle: Any) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # noqa: BLE001 - releasing a failed or in-flight transfer can fail; its error stands
            pass


def parse_address(address: str) -> dict:
    scheme, sep, rest = address.partition("://")
    if scheme != "nixl" or not sep:
        raise TransportError(f"the nixl transport takes nixl://<agent info> addresses, got {address[:40]!r}")
    try:
        info = json.loads(base64.urlsafe_b64decode(rest))
        info["md"] = base64.b64decode(info["md"])
        return info
    except (ValueError, KeyError) as e:
        raise TransportError(f"malformed nixl address {address[:40]!r}...: {e}") from None


def hello_body(metadata: bytes) -> bytes:
    """What a Hello's stamp covers: the metadata the receiver will connect to (by digest)."""
    return descs_body([], hashlib.sha256(metadata).hexdigest())
