"""A NIXL agent with one registered block pool, driven by one ProgressThread.

Shared by the nixl sender and receiver (each has its own agent). Memory is registered once (the pool);
a transfer names one (address, length) descriptor per tensor inside the two pools. NIXL's own progress
thread is off (16 ms per transfer on 2 cores): our ProgressThread polls notifications and transfer
states, often while work is pending.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from typing import Any

from transport.base import TransportError
from transport.pool import BlockPool
from transport.progress import Pending, ProgressThread

_nixl: Any = None


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
    """An agent, its pool (registered as DRAM here, VRAM on a GPU by the same calls) and its peers."""

    def __init__(self, role: str, *, pool_bytes: int, block_bytes: int = 1 << 16,
                 error_handling: str = "peer") -> None:
        lib = _lib()
        if pool_bytes < block_bytes:
            raise TransportError(f"pool_bytes={pool_bytes} is smaller than one block ({block_bytes} bytes)")
        self.name = f"{role}-{os.getpid()}-{secrets.token_hex(4)}"
        self.agent = lib.nixl_agent(self.name, lib.nixl_agent_config(enable_prog_thread=False, backends=[]))
        self.agent.create_backend("UCX", {"ucx_error_handling_mode": error_handling})
        self.pool = BlockPool(pool_bytes // block_bytes, block_bytes)
        base = self.pool.memory.data_ptr()
        self._reg = self.agent.register_memory([(base, self.pool.memory.nbytes, 0, "")], "DRAM")
        self.metadata = self.agent.get_agent_metadata()
        self.thread = ProgressThread(f"nixl-{role}", lambda: False)

    def address(self) -> str:
        """What a receiver publishes: its name, metadata and pool layout, so a sender needs no other lookup."""
        info = {"name": self.name, "md": base64.b64encode(self.metadata).decode(),
                "base": self.pool.memory.data_ptr(), "block": self.pool.block_bytes, "blocks": self.pool.blocks}
        return "nixl://" + base64.urlsafe_b64encode(json.dumps(info).encode()).decode()

    # --- progress thread only ---

    def add_peer(self, metadata: bytes) -> str:
        name = self.agent.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else name
        self.agent.make_connection(name)
        return name

    def forget(self, peer: str) -> None:
        try:
            self.agent.remove_remote_agent(peer)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def notifs(self) -> list[tuple[str, bytes]]:
        got = self.agent.get_new_notifs()
        return [(k.decode() if isinstance(k, bytes) else k, m) for k, msgs in got.items() for m in msgs]

    def xfer(self, op: str, peer: str, local: list[tuple[int, int]], remote: list[tuple[int, int]], what: str,
             timeout: float, notif: bytes = b"") -> Pending:
        """Start a READ or WRITE of (address, length) runs between the local pool and a peer's pool.

        One descriptor per tensor, not one per block: UCX moves each descriptor as its own operation, so
        a 4.5 MB tensor as 72 blocks of 64 KB took twice as long as one descriptor (measured)."""
        local_descs = self.agent.get_xfer_descs([(a, n, 0) for a, n in local], "DRAM")
        remote_descs = self.agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM")
        handle = self.agent.initialize_xfer(op, local_descs, remote_descs, peer, notif)
        state = self.agent.transfer(handle)

        def poll() -> tuple[bool, Any]:
            st = state if state != "PROC" else self.agent.check_xfer_state(handle)
            if st == "PROC":
                return False, None
            handle.release()
            if st != "DONE":
                raise TransportError(f"{what}: NIXL reported {st}; is the receiving worker alive?")
            return True, None

        def cancel() -> None:
            try:
                handle.release()
            except Exception:  # noqa: BLE001 - release of an in-flight transfer can fail; the deadline error stands
                pass

        return Pending(poll, time.monotonic() + timeout, what, cancel)

    def close(self) -> None:
        """Stop the thread, then release handles and the registration (after the thread: no concurrent calls)."""
        self.thread.stop()
        try:
            self.agent.deregister_memory(self._reg)
        except Exception:  # noqa: BLE001 - best effort at shutdown
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
