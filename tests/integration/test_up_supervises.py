"""`tierserve up` keeps serving through process deaths: a killed worker and a killed coordinator are
restarted (the exit cause logged), clients reconnect to the new coordinator, and nothing in `ps` shows a
secret; only SIGTERM/Ctrl-C stops the cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from coordinator.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.long]
REQUEST = {"model": "tiny-llava", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}


def _workers(port: int) -> list[dict]:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=1,
                         headers={"Authorization": "Bearer key-1"}).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def _served_within(port: int, limit_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=REQUEST, timeout=5,
                           headers={"Authorization": "Bearer key-1"})
            if r.status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None


def test_up_restarts_what_dies_and_keeps_secrets_off_command_lines(redis_url, tmp_path):
    port = free_port()
    keys = tmp_path / "keys"
    keys.write_text("key-1\n")
    env = dict(os.environ, TIERSERVE_ADMIN_TOKEN="admin-secret-1")
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "up", "--port", str(port), "--redis-url",
                             redis_url, "--key-prefix", f"tstest-{uuid.uuid4().hex[:10]}", "--api-key-file", str(keys),
                             "--log-dir", str(tmp_path / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_workers(port)) < 2:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        workers = {w["role"]: w for w in _workers(port)}
        assert set(workers) == {"encode", "combined"}
        cmdlines = [open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
                    for p in [w["pid"] for w in workers.values()] + _pids_of("coordinator.serve", str(port))]
        assert cmdlines and not any(s in c for c in cmdlines for s in ("key-1", "admin-secret-1", redis_url))

        os.kill(workers["combined"]["pid"], signal.SIGKILL)
        # The bound covers a cold restart (torch import + model load) on a busy 2-core machine.
        took = _served_within(port, 60)
        assert took is not None, f"not serving after a worker was killed; logs:\n{_log_tails(tmp_path / 'logs')}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and {w["role"] for w in _workers(port)} != {"encode", "combined"}:
            time.sleep(0.3)
        assert any(w["role"] == "combined" and w["pid"] != workers["combined"]["pid"] for w in _workers(port))

        coordinator = _pids_of("coordinator.serve", str(port))
        assert len(coordinator) == 1
        os.kill(coordinator[0], signal.SIGKILL)
        assert _served_within(port, 60) is not None, \
            f"clients could not reconnect to a restarted coordinator; logs:\n{_log_tails(tmp_path / 'logs')}"
        assert proc.poll() is None  # still up
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert "llm-0-combined exited (killed by SIGKILL); restarting it" in out, out
        assert "coordinator exited (killed by SIGKILL); restarting it" in out, out
        assert "stopped." in out
    finally:  # SIGTERM first: `up` then stops its workers (SIGKILL would orphan them)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _pids_of(*parts: str) -> list[int]:
    """Processes whose command line holds every one of `parts`."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                if all(p.encode() in cmdline for p in parts):
                    out.append(int(pid))
            except OSError:
                pass
    return out


def _log_tails(log_dir, lines: int = 8) -> str:
    """The last lines of each process's log, for a failure message."""
    out = []
    for path in sorted(log_dir.glob("*.log")):
        out += [f"== {path.name}", *path.read_text(errors="replace").splitlines()[-lines:]]
    return "\n".join(out)
