"""Hosts for multi-host tests: network namespaces joined by a bridge, each running its own sshd.

Each host is a namespace with one veth into a bridge in the root namespace, an address of a private
10.213.x.0/24 the test picks, and an sshd listening on it that takes a key generated for the test.
Ansible reaches them over SSH like any machine; they share this machine's filesystem (so every host
gets its own directory) and run no systemd (so the roles choose supervisord). Teardown kills every
process left in the namespaces, then removes them and the bridge.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def unavailable() -> str | None:
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "multi-host test needs root (network namespaces, sshd)"
    if shutil.which("ip") is None:
        return "multi-host test needs iproute2's `ip`"
    if not Path(SSHD).is_file():
        return f"multi-host test needs sshd at {SSHD} (apt-get install -y openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "multi-host test needs ssh-keygen (openssh-client)"
    probe = f"tsprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class NetnsHost:
    name: str
    namespace: str
    address: str
    sshd_pid: int = 0


@dataclass
class NetnsHosts:
    """`count` namespace hosts under `workdir` (keys, sshd files, one directory per host)."""

    workdir: Path
    count: int = 3
    hosts: list[NetnsHost] = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self.tag = tag
        self.subnet = f"10.213.{random.randrange(1, 250)}"
        self.bridge = f"tsb{tag}"
        self.key = self.workdir / "id_ed25519"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (where the test and Ansible run)."""
        return f"{self.subnet}.1"

    def start(self) -> "NetnsHosts":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.workdir / "host_key")], check=True)
        auth = self.workdir / "authorized_keys"
        auth.write_text(Path(f"{self.key}.pub").read_text())
        auth.chmod(0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(1, self.count + 1):
            host = NetnsHost(f"h{i}", f"ts{self.tag}h{i}", f"{self.subnet}.{10 + i}")
            outer, inner = f"tsv{self.tag}{i}", f"tsi{self.tag}{i}"
            _ip("netns", "add", host.namespace)
            self.hosts.append(host)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", inner, "netns", host.namespace)
            _ip("addr", "add", f"{host.address}/24", "dev", inner, ns=host.namespace)
            _ip("link", "set", inner, "up", ns=host.namespace)
            _ip("link", "set", "lo", "up", ns=host.namespace)
            pidfile = self.workdir / f"sshd-{host.name}.pid"
            subprocess.run(["ip", "netns", "exec", host.namespace, SSHD, "-f", "/dev/null",
                            "-o", f"ListenAddress={host.address}", "-o", f"HostKey={self.workdir / 'host_key'}",
                            "-o", f"PidFile={pidfile}", "-o", f"AuthorizedKeysFile={auth}",
                            "-o", "PermitRootLogin=prohibit-password", "-o", "PasswordAuthentication=no",
                            "-o", "StrictModes=no", "-o", "UsePAM=no", "-o", "Subsystem=sftp internal-sftp"],
                           check=True, capture_output=True, text=True)
            # sshd creates its pid file before it writes the pid: wait for the number, not for the file.
            deadline, pid = time.monotonic() + 10, ""
            while time.monotonic() < deadline:
                pid = pidfile.read_text().strip() if pidfile.exists() else ""
                if pid.isdigit():
                    break
                time.sleep(0.05)
            if not pid.isdigit():
                raise RuntimeError(f"sshd in namespace {host.namespace} wrote no pid to {pidfile} within 10 s")
            host.sshd_pid = int(pid)

    def inventory_vars(self, host: NetnsHost) -> dict:
        """How Ansible reaches `host`, and where it keeps its files (the hosts share one filesystem)."""
        home = self.workdir / "hosts" / host.name
        return {"ansible_host": host.address, "ansible_user": "root", "ansible_port": 22,
                "ansible_ssh_private_key_file": str(self.key),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                "ansible_python_interpreter": "/usr/bin/python3", "tierserve_advertise_address": host.address,
                "common_home": str(home), "common_config_dir": str(home / "etc")}

    def pids(self, host: NetnsHost) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def processes(self, host: NetnsHost) -> list[str]:
        """The command lines of every process in `host`'s namespace (sshd included)."""
        out = []
        for pid in self.pids(host):
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
        return out

    def stop(self) -> None:
        for host in self.hosts:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = self.pids(host)
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + 5
                while self.pids(host) and time.monotonic() < deadline:
                    time.sleep(0.1)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
