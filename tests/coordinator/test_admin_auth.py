"""The admin API's guard: its token when one is set, a loopback Host when none is (DNS rebinding), and
`python -m coordinator.serve` refusing a non-loopback bind without a token."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from live_app import app_client

from coordinator.auth import bind_refusal, is_loopback
from coordinator.protocol import envs
from coordinator.redis_server import free_port

pytestmark = pytest.mark.redis

TOKEN = "admin-token-0123456789"
API_KEY = "sk-test-alpha-0123456789"


async def test_the_token_is_required_when_set(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix, admin_token=TOKEN, api_keys=(API_KEY,)) as (_, client):
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Bearer {API_KEY}"},
                        {"Authorization": TOKEN}, [(b"Authorization", b"Bearer \xff\xfe")]):
            r = await client.get("/v1/admin/policy", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_admin_token"
            assert TOKEN not in r.text
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/v1/admin/policy", headers=ok)).status_code == 200
        r = await client.put("/v1/admin/policy", headers=ok, json={"batch": {"max_batch": 3}})
        assert r.status_code == 200 and r.json()["batch"]["max_batch"] == 3
        # the admin token opens the admin API only; with a token set, any Host may reach it
        r = await client.get("/v1/admin/policy", headers={**ok, "Host": "coordinator.internal:8000"})
        assert r.status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "127.0.0.1", "localhost", "LOCALHOST:9000", "[::1]:8000",
                                  "[::1]", "127.0.0.2:80"])
async def test_without_a_token_loopback_hosts_are_let_in(redis_url, key_prefix, host):
    async with app_client(redis_url, key_prefix) as (_, client):
        r = await client.get("/v1/admin/policy", headers={"Host": host})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io:8000",
                                  "localhost.attacker.example", "10.0.0.5:8000", "[::2]:8000", "0.0.0.0:8000"])
async def test_without_a_token_other_hosts_are_refused(redis_url, key_prefix, host):
    """A page on attacker.example whose name was rebound to 127.0.0.1 reaches this port with its own Host."""
    async with app_client(redis_url, key_prefix) as (_, client):
        for method in ("GET", "PUT"):
            r = await client.request(method, "/v1/admin/policy", headers={"Host": host}, json={"batch": {"max_batch": 7}})
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert error["code"] == "host_not_allowed" and "DNS rebinding" in error["message"]
            assert host in error["message"]
        policy = (await client.get("/v1/admin/policy")).json()
    assert policy["batch"]["max_batch"] != 7  # the refused PUT changed nothing


def test_bind_refusal():
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "[::1]", "localhost", "127.3.2.1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "example.org", ""))
    assert bind_refusal("127.0.0.1", None) is None and bind_refusal("0.0.0.0", "t") is None
    assert "TIERSERVE_ADMIN_TOKEN" in bind_refusal("0.0.0.0", None)


def _serve(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERSERVE_")}
    return subprocess.run([sys.executable, "-m", "coordinator.serve", "--redis-url", redis_url,
                           "--port", str(free_port()), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serve_refuses_a_non_loopback_bind_without_a_token(redis_url, host):
    started = time.monotonic()
    done = _serve(redis_url, "--host", host)
    assert done.returncode == 2, done.stderr
    assert f"refusing to listen on {host}" in done.stderr
    assert "TIERSERVE_ADMIN_TOKEN" in done.stderr and "--admin-token-file" in done.stderr
    assert "Uvicorn running" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_serve_says_which_secret_file_it_cannot_read(redis_url, tmp_path):
    done = _serve(redis_url, "--api-key-file", str(tmp_path / "missing"),
                  **{envs.ADMIN_TOKEN: TOKEN})
    assert done.returncode == 2
    assert "cannot read a key or token file" in done.stderr and "missing" in done.stderr
    assert "Traceback" not in done.stderr
