"""`tierserve up` runs until Ctrl-C, then stops every process it started."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from coordinator.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_the_whole_cluster(redis_url, tmp_path):
    """Also: weights from another local directory load the same way, and name the served model."""
    model = tmp_path / "my-llava"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "up", "--port", str(port), "--redis-url",
                             redis_url, "--key-prefix", f"tstest-{uuid.uuid4().hex[:10]}", "--model", str(model)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        workers = []
        while time.monotonic() < deadline and len(workers) < 2:
            assert proc.poll() is None, proc.stdout.read()
            try:
                workers = httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=1).json()["workers"]
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.3)
        assert sorted(w["role"] for w in workers) == ["combined", "encode"]
        assert {w["model"] for w in workers} == {"my-llava"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"][0]["id"] == "my-llava"
        pids = [w["pid"] for w in workers]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "stopped." in out and "Traceback" not in out
        assert not [p for p in pids if _alive(p)]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
