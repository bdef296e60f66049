"""`tierserve up`: a local cluster of separate processes (coordinator, encode and LLM workers) on Redis."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from coordinator.protocol import envs
from coordinator.protocol.colocation import channel_path
from coordinator.protocol.keys import Keys
from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME
from coordinator.protocol.roles import LLM_ROLES
from coordinator.protocol.worker_config import DEVICE_PATTERN, DTYPES
from coordinator.redis_server import PrivateRedis
from coordinator.supervisor import RestartPolicy, Supervisor, exit_cause



class ClusterError(RuntimeError):
    pass


@dataclass
class ClusterSpec:
    encode_workers: int = 1
    llm_roles: list[str] = field(default_factory=lambda: ["combined"])
    model_dir: Path = DEFAULT_MODEL_DIR
    model_name: str = ""
    """What clients put in `model`; default: "tiny-llava" for the embedded model, else the directory's name."""
    redis_url: str | None = None
    """None: start a private redis-server for this cluster."""
    key_prefix: str = "tierserve"
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int = 1
    local_prefill: bool = False
    """Start a prefill worker beside each encode worker (sharing its GPU), for the offload share s."""
    steal: bool = False
    """Start a combined worker beside each encode worker that steals whole requests while the encoder
    is idle (time sharing); stealing itself is switched on by the policy (`stealing.enabled`)."""
    pin_cores: bool = False
    """Emulate one device per CPU core: encode worker i and the workers sharing its GPU run on core i,
    remote LLM worker j on the next core (modulo the cores there are); the coordinator floats. Without
    it every process competes for every core, and an "idle" encode device is not idle."""
    llm_args: list[str] = field(default_factory=list)
    """Extra flags for every `python -m llm_node` (e.g. --max-num-seqs 4 to emulate a KV-memory limit)."""
    coordinator_args: list[str] = field(default_factory=list)
    """Extra flags for `python -m coordinator.serve`."""
    transport: str = "local"
    """Tensor transport of every worker (local, tcp, ucx, nixl; transport/README.md)."""
    secrets_env: dict[str, str] = field(default_factory=dict)
    """Secrets for the coordinator (envs.API_KEYS, envs.ADMIN_TOKEN, ...), handed to it through its environment,
    never its command line. The Redis URL and a fresh per-cluster transfer secret go to every process this way."""
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    """How `supervise` restarts a process that exits (tierserve up)."""
    device: str = "cpu"
    """Where the workers run: "cpu"; "cuda:N": every worker on GPU N; "cuda": one GPU per device slot (encode
    worker i and the workers sharing its GPU on slot i, remote LLM worker j on slot encode_workers + j)."""
    dtype: str = "float32"
    """Every worker's model dtype (float32, bfloat16, float16)."""
    drain_timeout_s: float = 0.0
    """Seconds a worker `start` spawns keeps serving what it holds after a SIGTERM (`retire`, `stop`), taking
    nothing new; 0: it exits at once and the coordinator re-runs what it held. Workers `add_worker` starts get
    their caller's flags (the plan switch's executor passes its own)."""
    gpu_indices: list[int] | None = None
    """With device "cuda": the CUDA index of each device slot (a plan's gpu_index per GPU); None: slot k is cuda:k."""
    colocated: list[frozenset[str]] | None = None
    """Per encode worker, the LLM workers sharing its GPU ({"prefill"}, {"steal"}, both or none), when they
    differ between encoders (a plan's E and E+P GPUs); None: `local_prefill` and `steal` for every one."""

    def colocated_with(self, encoder: int) -> frozenset[str]:
        """The co-located workers encode worker `encoder` gets."""
        if self.colocated is not None:
            return self.colocated[encoder]
        return frozenset({"prefill"} if self.local_prefill else set()) | ({"steal"} if self.steal else set())

    def placement(self, slot: int) -> list[str]:
        """The --device and --dtype flags of a worker on device slot `slot`."""
        device = self.device
        if device == "cuda":
            planned = self.gpu_indices is not None and slot < len(self.gpu_indices)
            device = f"cuda:{self.gpu_indices[slot] if planned else slot}"  # type: ignore[index]
        return ["--device", device, "--dtype", self.dtype]

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        if not self.model_name:
            same = self.model_dir.resolve() == DEFAULT_MODEL_DIR.resolve()
            self.model_name = DEFAULT_MODEL_NAME if same else self.model_dir.resolve().name

    def validate(self) -> None:
        if not (self.model_dir / "config.json").is_file():
            raise ClusterError(f"{self.model_dir} is not a checkpoint directory (no config.json); "
                               "pass --model with a local transformers checkpoint")
        bad = [r for r in self.llm_roles if r not in LLM_ROLES]
        if bad:
            raise ClusterError(f"unknown LLM role(s) {bad}; use a comma list of {', '.join(LLM_ROLES)}")
        if self.colocated is not None and len(self.colocated) != self.encode_workers:
            raise ClusterError(f"colocated lists {len(self.colocated)} encode workers, not {self.encode_workers}")
        local = [("prefill" in self.colocated_with(i)) for i in range(self.encode_workers)]
        if not any(r in ("combined", "prefill") for r in self.llm_roles) and not (self.encode_workers > 0 and all(local)):
            raise ClusterError("no LLM worker can prefill what every encode worker sends; add a combined or prefill "
                               "worker (--llm combined), or a prefill worker beside each encode worker (--local-prefill)")
        if "prefill" in self.llm_roles and "decode" not in self.llm_roles:
            raise ClusterError("a prefill worker hands its KV cache to a decode worker; add one (--llm prefill,decode)")
        if any(local) and "decode" not in self.llm_roles:
            raise ClusterError("local prefill workers hand their KV cache to a decode worker; add one "
                               "(--llm combined,decode)")
        if not DEVICE_PATTERN.fullmatch(self.device) or self.dtype not in DTYPES:
            raise ClusterError(f"--device {self.device!r} --dtype {self.dtype!r}: use cpu, cuda (one GPU per worker "
                               f"slot) or cuda:N, and one of {', '.join(DTYPES)}")
        if self.encode_workers < 0:
            raise ClusterError("--encode must be >= 0")


class LocalCluster:
    """Starts everything, waits until every worker has registered, and stops it all on exit."""

    def __init__(self, spec: ClusterSpec, log_dir: Path | None = None):
        spec.validate()
        self.spec = spec
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="tierserve-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: PrivateRedis | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, tuple[list[str], int | None]] = {}
        """What each process was started with, to start it again."""
        self.redis_url = spec.redis_url or ""
        self.supervisor = Supervisor(spec.restart)
        self.cluster_secret = os.environ.get(envs.CLUSTER_SECRET) or secrets.token_hex(32)
        self._stopping = False

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def _spawn(self, name: str, argv: list[str], device: int | None = None) -> None:
        self.argv[name] = (argv, device)
        if device is not None:  # a worker: its device slot places it
            argv = [*argv, *self.spec.placement(device)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(self.spec.threads),
                   **{envs.REDIS_URL: self.redis_url, envs.CLUSTER_SECRET: self.cluster_secret})
        if name == "coordinator":
            env.update(self.spec.secrets_env)
        pin = None
        if self.spec.pin_cores and device is not None:
            cores = sorted(os.sched_getaffinity(0))
            core = cores[device % len(cores)]
            pin = lambda: os.sched_setaffinity(0, {core})  # noqa: E731 (runs in the child before exec)
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env,
                                                preexec_fn=pin)

    def start(self, timeout_s: float = 120.0, report=print) -> "LocalCluster":
        """Start everything and wait until the coordinator reports every worker; `report` says what
        supervision did meanwhile (a process killed while starting is restarted, as it is later)."""
        try:
            self._start(timeout_s, report)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout_s: float, report) -> None:
        s = self.spec
        if not self.redis_url:
            self.redis = PrivateRedis().start()
            self.redis_url = self.redis.url
        common = ["--key-prefix", s.key_prefix, "--model", str(s.model_dir),
                  "--model-name", s.model_name, "--threads", str(s.threads), "--transport", s.transport,
                  *(["--drain-timeout-s", str(s.drain_timeout_s)] if s.drain_timeout_s > 0 else [])]
        for i in range(s.encode_workers):
            self._spawn(f"encode-{i}", ["-m", "encode_node", "--worker-id", f"encode-{i}", *common], device=i)
        colocated = 0
        for i in range(s.encode_workers):
            if "prefill" in s.colocated_with(i):
                self._spawn(f"llm-local-{i}", ["-m", "llm_node", "--worker-id", f"llm-local-{i}", "--role", "prefill",
                                               "--colocate-with", f"encode-{i}", *common, *s.llm_args], device=i)
            if "steal" in s.colocated_with(i):
                self._spawn(f"llm-steal-{i}", ["-m", "llm_node", "--worker-id", f"llm-steal-{i}", "--role", "combined",
                                               "--colocate-with", f"encode-{i}", *common, *s.llm_args], device=i)
            colocated += len(s.colocated_with(i))
        for i, role in enumerate(s.llm_roles):
            self._spawn(f"llm-{i}-{role}", ["-m", "llm_node", "--worker-id", f"llm-{i}-{role}", "--role", role, *common,
                                                     *s.llm_args], device=s.encode_workers + i)
        self._spawn("coordinator", ["-m", "coordinator.serve", "--key-prefix",
                                    s.key_prefix, "--model", str(s.model_dir), "--model-name", s.model_name, "--host", s.host, "--port",
                                    str(s.port), *s.coordinator_args])
        self.wait_ready(s.encode_workers + colocated + len(s.llm_roles), timeout_s, report)

    def wait_ready(self, n_workers: int, timeout_s: float, report=print) -> None:
        """A process that exits on its own while starting (a bad flag, a model that does not load) fails the
        start with its log; one killed by a signal (kill -9, the OOM killer) is restarted like any later death."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None and (p.returncode >= 0 or self.supervisor.given_up(name)):
                    raise ClusterError(f"{name} exited while starting ({exit_cause(p.returncode)}):\n"
                                       f"{self.tail(name)}")
            self.supervise(report)
            try:
                r = httpx.get(f"{self.url}/health", timeout=1.0)
                body = r.json()
                if r.status_code == 200 and body.get("workers", 0) >= n_workers:
                    return
                last = str(body)
            except (httpx.HTTPError, ValueError) as e:
                last = str(e)
            time.sleep(0.2)
        raise ClusterError(f"cluster not ready after {timeout_s:.0f} s (last health: {last}); logs in {self.log_dir}")

    def supervise(self, report=print) -> None:
        """One pass of supervision (call it every fraction of a second): a process that exited is reported
        with its cause, taken out of routing at once (its registry entry is deleted, so the coordinator re-runs
        its requests now rather than when its heartbeat lapses) and restarted after a backoff."""
        if self._stopping:
            return
        for name, p in self.procs.items():
            if p.poll() is None or self.supervisor.waiting(name):
                continue
            message, _ = self.supervisor.exited(name, p.returncode)
            report(message + (f"\n{self.tail(name, 5)}" if p.returncode > 0 else ""))
            if name != "coordinator":
                self._expire(name)
        for name in self.supervisor.due():
            argv, device = self.argv[name]
            self._spawn(name, argv, device)
            report(f"{name} restarted (restart {self.supervisor.restarts(name)})")

    def add_worker(self, name: str, module: str, role: str, colocate_with: str | None = None,
                   extra: list[str] | None = None) -> None:
        """Start one more worker under supervision (a plan switch, coordinator/oserve/local_executor.py)."""
        s = self.spec
        argv = ["-m", module, "--worker-id", name, *(["--role", role] if module == "llm_node" else []),
                *(["--colocate-with", colocate_with] if colocate_with else []), "--key-prefix", s.key_prefix,
                "--model", str(s.model_dir), "--model-name", s.model_name, "--threads", str(s.threads),
                "--transport", s.transport, *(s.llm_args if module == "llm_node" else []), *(extra or [])]
        self._spawn(name, argv, device=len(self.argv))

    def retire(self, name: str) -> subprocess.Popen | None:
        """Stop supervising a worker and ask it to stop (SIGTERM: it drains if it can); returns its process,
        for the caller to wait on (and kill past its own deadline)."""
        self.argv.pop(name, None)
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
        return p

    def _expire(self, worker_id: str) -> None:
        import redis

        try:
            client = redis.Redis.from_url(self.redis_url, socket_timeout=1.0)
            try:
                client.delete(Keys(self.spec.key_prefix).worker(worker_id))
            finally:
                client.close()
        except redis.RedisError:
            pass  # its heartbeat's TTL takes it out of routing a moment later

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Workers first (they deregister), then the coordinator, then Redis."""
        self._stopping = True
        order = [n for n in self.procs if n != "coordinator"] + (["coordinator"] if "coordinator" in self.procs else [])
        for name in order:
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in order:
            p = self.procs[name]
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        for name, (argv, _) in self.argv.items():  # each encode worker's co-location file (64 bytes), now unused
            if "encode_node" in argv:
                channel_path(self.spec.key_prefix, name).unlink(missing_ok=True)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
