"""Schema fuzzing: schemathesis generates requests from the coordinator's own OpenAPI document and sends them
to the live test cluster (real workers, so a valid chat request is answered, not 503'd). Every answer must
be below 500 and match what the document declares: status code, content type and body schema.

Bounded and repeatable: a fixed number of cases per operation, derandomized. Generation is kept short by
clamping each chat request's token budget, and most chat requests name the served model so they reach the
workers (the rest exercise the 404).
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_TOKENS = 3
CASES = {  # (path, method, mode): examples; about 300 cases in all
    ("/v1/chat/completions", "POST", GenerationMode.POSITIVE): 120,
    ("/v1/chat/completions", "POST", GenerationMode.NEGATIVE): 80,
    ("/v1/models", "GET", GenerationMode.POSITIVE): 15,
    ("/v1/cluster", "GET", GenerationMode.POSITIVE): 15,
    ("/v1/admin/policy", "GET", GenerationMode.POSITIVE): 15,
    ("/v1/admin/policy", "PUT", GenerationMode.POSITIVE): 30,
    ("/health", "GET", GenerationMode.POSITIVE): 10,
    ("/metrics", "GET", GenerationMode.POSITIVE): 10,
}


@pytest.fixture(scope="module")
def api(cluster):
    return schemathesis.openapi.from_url(f"{cluster.url}/openapi.json")


@pytest.fixture(scope="module")
def served_model(cluster) -> str:
    return httpx.get(f"{cluster.url}/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module", autouse=True)
def policy_restored(cluster):
    """PUT /v1/admin/policy is fuzzed too; the shared cluster gets its policy back for the tests after."""
    before = httpx.get(f"{cluster.url}/v1/admin/policy").json()
    yield
    assert httpx.put(f"{cluster.url}/v1/admin/policy", json=before).status_code == 200


def steer(body, model: str) -> None:
    """Keep a generated chat request cheap (a few tokens) and, for most, addressed to the served model."""
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(field), int) and body[field] > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    if isinstance(body.get("model"), str) and len(body["model"]) % 4 != 3:
        body["model"] = model
    if isinstance(body.get("messages"), list) and len(body["messages"]) % 2 == 1:  # a semantic rule the
        body["messages"].append({"role": "user", "content": "Say hi"})  # schema cannot state: a user turn

@pytest.mark.parametrize("path,method,mode", list(CASES), ids=lambda v: getattr(v, "value", v))
def test_answers_are_below_500_and_as_declared(api, served_model, path, method, mode):
    operation = api[path][method]
    statuses: Counter[int] = Counter()

    @settings(max_examples=CASES[(path, method, mode)], derandomize=True, deadline=30_000, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        steer(case.body, served_model)
        statuses[case.call_and_validate(checks=CHECKS, timeout=60).status_code] += 1

    run()
    print(path, method, mode.value, dict(statuses))
    # an operation without parameters or body has one distinct case, which hypothesis sends once
    varied = path == "/v1/chat/completions" or method == "PUT"
    assert sum(statuses.values()) >= (CASES[(path, method, mode)] // 2 if varied else 1), "too few cases ran"
    if (path, mode) == ("/v1/chat/completions", GenerationMode.POSITIVE):
        assert statuses[200] >= 10, f"too few generated requests reached the workers: {dict(statuses)}"
