"""API keys on /v1/*: the real app on a real Redis, reached through httpx and the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest
from live_app import app_client, chat_body, openai_client

from coordinator.auth import SecretError, load_secrets
from coordinator.protocol import envs

pytestmark = pytest.mark.redis

KEYS = ("sk-test-alpha-0123456789", "sk-test-beta-9876543210")
GUARDED = [("GET", "/v1/models", None), ("GET", "/v1/cluster", None),
           ("POST", "/v1/chat/completions", chat_body())]


async def call(client: httpx.AsyncClient, method: str, path: str, body, headers: dict | list) -> httpx.Response:
    return await client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("method,path,body", GUARDED)
async def test_no_key_is_openais_401(redis_url, key_prefix, method, path, body):
    async with app_client(redis_url, key_prefix, api_keys=KEYS) as (_, client):
        r = await call(client, method, path, body, {})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] is None and error["code"] is None
    assert error["message"].startswith("You didn't provide an API key")


@pytest.mark.parametrize("method,path,body", GUARDED)
async def test_wrong_key_is_401_without_echoing_it(redis_url, key_prefix, method, path, body):
    wrong = "sk-test-gamma-5555555555"
    async with app_client(redis_url, key_prefix, api_keys=KEYS) as (_, client):
        r = await call(client, method, path, body, {"Authorization": f"Bearer {wrong}"})
    assert r.status_code == 401
    error = r.json()["error"]
    assert error == {"message": error["message"], "type": "invalid_request_error", "param": None,
                     "code": "invalid_api_key"}
    assert error["message"].startswith("Incorrect API key provided: sk-********5555.")
    assert wrong not in r.text


@pytest.mark.parametrize("header", [
    b"", b"Bearer", b"Bearer ", b"Basic c2stdGVzdA==", KEYS[0].encode(),  # no scheme: not a bearer token
    b"Bearer \xe9\xff\xfe", "Bearer cl\u00e9-\u00fc".encode(), "Bearer \u5bc6\u94a5".encode(),
    b"Bearer " + KEYS[0].encode() + b"\xe9",
])
async def test_empty_malformed_or_non_ascii_header_is_401_not_500(redis_url, key_prefix, header):
    async with app_client(redis_url, key_prefix, api_keys=KEYS) as (_, client):
        r = await client.get("/v1/models", headers=[(b"Authorization", header)])
    assert r.status_code == 401, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


async def test_every_configured_key_works_with_the_openai_client(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix, api_keys=KEYS) as (app, client):
        for key in KEYS:
            models = await openai_client(client, key).models.list()
            assert [m.id for m in models.data] == [app.state.tierserve.config.model_name]
        with pytest.raises(openai.AuthenticationError) as e:
            await openai_client(client, "sk-not-one-of-them-000").models.list()
        assert e.value.code == "invalid_api_key"
        # With the right key a chat request gets past auth: here no worker is alive, which is a 503, not a 401.
        with pytest.raises(openai.APIStatusError) as e:
            await openai_client(client, KEYS[1]).chat.completions.create(**chat_body())
        assert e.value.status_code == 503


async def test_health_and_metrics_stay_open(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix, api_keys=KEYS) as (_, client):
        assert (await client.get("/health")).status_code == 200
        metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and "tierserve" in metrics.text


async def test_no_keys_configured_leaves_v1_open(redis_url, key_prefix):
    async with app_client(redis_url, key_prefix) as (_, client):
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/v1/cluster", headers={"Authorization": "Bearer anything"})).status_code == 200


def test_keys_are_the_union_of_flags_file_and_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "keys"
    key_file.write_text("# one key a line\nsk-from-file-1\n\nsk-shared\n")
    monkeypatch.setenv(envs.API_KEYS, "sk-from-env, sk-shared")
    monkeypatch.setenv(envs.ADMIN_TOKEN, "admin-from-env")
    keys, token = load_secrets(["sk-from-flag"], key_file, None, None)
    assert keys == ("sk-from-flag", "sk-from-file-1", "sk-shared", "sk-from-env")
    assert token == "admin-from-env"
    token_file = tmp_path / "token"
    token_file.write_text("admin-from-file\n")
    assert load_secrets([], None, None, token_file)[1] == "admin-from-file"  # a flag's file beats the env


@pytest.mark.parametrize("keys", [["sk-ok", ""], ["cl\u00e9"], ["two words"]])
def test_a_key_no_client_could_send_is_refused_without_printing_it(keys, monkeypatch):
    monkeypatch.delenv(envs.API_KEYS, raising=False)
    monkeypatch.delenv(envs.API_KEYS_FILE, raising=False)
    with pytest.raises(SecretError, match=f"API key number {len(keys)} .*printable ASCII") as e:
        load_secrets(keys, None, None, None)
    assert keys[-1] not in str(e.value) or keys[-1] == ""
