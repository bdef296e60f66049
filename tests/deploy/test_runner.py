"""What `tierserve deploy up` prepares before Ansible runs: a reproducible wheel (the same sources give the same
bytes, so a re-run installs nothing) and the cluster's secrets file (mode 0600, refused when others can read it)."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from coordinator.deploy.hosts import DeployError
from coordinator.deploy.runner import SECRET_NAMES, build_wheel, ensure_secrets

pytestmark = pytest.mark.slow


def test_the_wheel_of_one_checkout_is_byte_identical(tmp_path):
    first, second = build_wheel(tmp_path / "a"), build_wheel(tmp_path / "b")
    assert first.name.startswith("tierserve-") and first.suffix == ".whl"
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()


def test_secrets_are_made_once_private_and_checked(tmp_path):
    path = ensure_secrets(tmp_path / "cluster.secrets.yml")
    assert path.stat().st_mode & 0o777 == 0o600
    values = yaml.safe_load(path.read_text())
    assert sorted(values) == sorted(SECRET_NAMES) and all(len(v) == 64 for v in values.values())
    assert yaml.safe_load(ensure_secrets(path).read_text()) == values  # kept: a re-run changes nothing
    path.chmod(0o644)
    with pytest.raises(DeployError, match="readable by others; chmod 600"):
        ensure_secrets(path)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump({"tierserve_admin_token": "short"}))
    with pytest.raises(DeployError, match="lacks tierserve_cluster_secret, tierserve_admin_token, tierserve_redis_password"):
        ensure_secrets(path)
