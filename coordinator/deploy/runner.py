"""Running deploy/'s playbooks for `tierserve deploy up|status|restart|down`: where the playbooks and
`ansible-playbook` are, the cluster's secrets file, and the wheel built from this checkout."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.deploy.hosts import DeployError

SECRET_NAMES = ("tierserve_cluster_secret", "tierserve_admin_token", "tierserve_redis_password")
"""The secrets every cluster has (deploy/roles/common checks them): transfers' HMAC key, the admin API's
token, Redis's password."""
REPRODUCIBLE_EPOCH = "315532800"
"""SOURCE_DATE_EPOCH for wheel builds: the same sources give the same bytes, so a re-run installs nothing."""


def checkout_root() -> Path | None:
    """The source checkout this package runs from (None when installed from a wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "deploy" / "site.yml").is_file() else None


def playbooks_dir(given: str | None) -> Path:
    """The deploy/ directory: `given`, else the checkout's."""
    root = checkout_root()
    path = Path(given) if given else (root / "deploy" if root is not None else Path("deploy"))
    if not (path / "site.yml").is_file():
        raise DeployError(f"no deploy playbooks at {path} (site.yml missing); pass --playbooks DIR with the deploy/ "
                          f"directory of a tierserve checkout")
    return path


def ansible_playbook() -> str:
    """The ansible-playbook beside this Python, else on PATH."""
    here = Path(sys.executable).with_name("ansible-playbook")
    found = str(here) if here.is_file() else shutil.which("ansible-playbook")
    if found is None:
        raise DeployError("ansible-playbook is not installed; `pip install 'ansible-core==2.19.*'` (or `make "
                          "deploy-deps` in a checkout)")
    return found


def ensure_secrets(path: Path) -> Path:
    """The cluster's secrets file: created (mode 0600, fresh random values) when missing, checked otherwise."""
    import yaml

    if path.exists():
        doc = yaml.safe_load(path.read_text()) or {}
        missing = [n for n in SECRET_NAMES if len(str(doc.get(n) or "")) < 32]
        if missing:
            raise DeployError(f"secrets file {path} lacks {', '.join(missing)} (at least 32 characters each); "
                              f"delete it to have fresh ones written")
        if path.stat().st_mode & 0o077:
            raise DeployError(f"secrets file {path} is readable by others; chmod 600 {path}")
        return path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# tierserve cluster secrets (mode 0600; keep with the inventory, or move into ansible-vault)\n")
        f.write(yaml.safe_dump({n: secrets.token_hex(32) for n in SECRET_NAMES}))
    return path


def build_wheel(out_dir: Path) -> Path:
    """A wheel of this checkout, byte-identical for identical sources (SOURCE_DATE_EPOCH). Built from a copy of
    the sources, so that concurrent builds and stale files in the checkout's build/ never leak into it."""
    import tempfile

    root = checkout_root()
    if root is None:
        raise DeployError("this tierserve is not a source checkout: pass --wheel PATH or --package SPEC")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("tierserve-*.whl"):
        old.unlink()
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", "tests", "deploy",
                                  "results")
    env = dict(os.environ, SOURCE_DATE_EPOCH=REPRODUCIBLE_EPOCH)
    with tempfile.TemporaryDirectory(prefix="tierserve-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(root, src, ignore=skip)
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "-w", str(out_dir.resolve()), str(src)], env=env, capture_output=True, text=True)
    wheels = sorted(out_dir.glob("tierserve-*.whl"))
    if r.returncode != 0 or not wheels:
        raise DeployError(f"building the wheel of {root} failed:\n{r.stderr[-2000:]}")
    return wheels[0]


@dataclass
class Playbook:
    """One ansible-playbook run against an inventory, with the cluster's secrets."""

    inventory: Path
    playbooks: Path
    secrets: Path
    extra_vars: dict = field(default_factory=dict)
    ansible_args: list[str] = field(default_factory=list)

    def argv(self, name: str) -> list[str]:
        import json

        argv = [ansible_playbook(), "-i", str(self.inventory), str(self.playbooks / name), "-e", f"@{self.secrets}"]
        if self.extra_vars:
            argv += ["-e", json.dumps(self.extra_vars)]
        return argv + self.ansible_args

    def run(self, name: str) -> int:
        env = dict(os.environ, ANSIBLE_CONFIG=str(self.playbooks / "ansible.cfg"))
        return subprocess.call(self.argv(name), env=env, cwd=self.playbooks)
