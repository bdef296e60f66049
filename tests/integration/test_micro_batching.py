"""Micro-batches on the live cluster: the dispatch policy forms them, the encoder runs them as formed."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from media_factory import data_url, image_bytes

from coordinator.policies.base import BatchPolicyConfig

pytestmark = [pytest.mark.redis, pytest.mark.slow]


async def _burst(base: str, n: int) -> list[int]:
    """n image requests at once; the encoder batch size each one was part of."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        async def one(i: int) -> int:
            r = await client.post("/v1/chat/completions", json={
                "model": "tiny-llava", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image_bytes(i, 64, 64))}}, {"type": "text", "text": "hi"}]}]})
            assert r.status_code == 200, r.text
            return r.json()["tierserve"]["compute"]["encode_batch"]
        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.fixture
def policy(cluster):
    """Set the live policy for one test, then restore the one the cluster had."""
    def put(**batch) -> dict:  # the whole section: the endpoint merges, and no knob of another test may linger
        full = BatchPolicyConfig(**batch).model_dump(mode="json")
        r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"batch": full}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["batch"]
    before = httpx.get(f"{cluster.url}/v1/admin/policy", timeout=10).json()["batch"]
    yield put
    put(**before)


def test_a_cluster_started_without_batching_flags_serves_adaptive_work_conserving(cluster):
    batch = httpx.get(f"{cluster.url}/v1/admin/policy", timeout=10).json()["batch"]
    assert (batch["name"], batch["work_conserving"]) == ("adaptive", True), batch


def test_pass_through_encodes_one_request_at_a_time(cluster, policy):
    assert policy(name="pass_through")["name"] == "pass_through"
    assert asyncio.run(_burst(cluster.url, 6)) == [1] * 6


def test_size_trigger_forms_batches_of_b(cluster, policy):
    policy(name="fixed_timeout", max_batch=4, timeout_s=2.0)  # a burst fills B long before the timeout
    sizes = asyncio.run(_burst(cluster.url, 8))
    assert sorted(sizes) == [4] * 8


def test_adaptive_batches_a_burst_and_never_exceeds_b(cluster, policy):
    policy(name="adaptive", max_batch=4, max_wait_s=1.0)
    asyncio.run(_burst(cluster.url, 4))  # lets the rate estimate see a few arrivals
    sizes = asyncio.run(_burst(cluster.url, 12))
    assert max(sizes) <= 4 and sizes.count(4) >= 4, sizes  # most requests rode in full batches
    values = _metrics(cluster.url)
    assert values[("tierserve_arrival_rate", "encode-0")] > 0                    # the lambda estimate
    assert values[("tierserve_idle_threshold_seconds", "encode-0")] > 0          # g = kappa / lambda
    assert ("tierserve_dispatch_queue", "encode-0") in values                    # open-batch length
    assert values[("tierserve_encode_batch_size_count", "")] >= 16 / 4          # released batches
    assert values[("tierserve_encode_batch_size_sum", "")] >= 16                 # requests in them
    assert values[("tierserve_ttft_seconds_count", "")] >= 16
    assert ("tierserve_tpot_seconds_count", "") in values


def _dispatch_wait(base: str, i: int) -> float:
    """One request alone: seconds from its submission to its encode worker taking its batch."""
    r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "model": "tiny-llava", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(image_bytes(100 + i, 64, 64))}}, {"type": "text", "text": "hi"}]}]})
    assert r.status_code == 200, r.text
    at = {}
    t = 0.0
    for hop, seconds in r.json()["tierserve"]["stages_s"].items():
        a, b = hop.split("->")
        at.setdefault(a, t)
        t += seconds
        at[b] = t
    return at["encode_dequeued"] - at["submitted"]


@pytest.mark.parametrize("conserving", [False, True])
def test_work_conserving_adaptive_sends_to_an_idle_encoder_at_once(cluster, policy, conserving):
    policy(name="adaptive", max_batch=8, max_wait_s=1.0, work_conserving=conserving)
    waits = [_dispatch_wait(cluster.url, i) for i in range(5)]  # one at a time: the encoder is idle at each arrival
    if conserving:
        assert max(waits) < 0.07, waits
    else:  # the negative control: once lambda is known (3 arrivals, each ~0.1 s apart), EAServe's rule holds
        assert min(waits[3:]) > 0.07, waits  # each for g = kappa / lambda, kappa(B=8, p=0.6) = 2.65: > 0.13 s
    sizes = asyncio.run(_burst(cluster.url, 12))
    assert max(sizes) <= 8 and max(sizes) > 1, sizes                      # behind a busy encoder, batches form


def _metrics(base: str) -> dict[tuple[str, str], float]:
    """/metrics samples as (name, worker label) -> value, summed over other labels ("" when unlabelled)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("worker", ""))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def test_bad_policy_update_is_a_400_and_changes_nothing(cluster, policy):
    before = httpx.get(f"{cluster.url}/v1/admin/policy", timeout=10).json()
    r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"batch": {"max_batch": 0}}, timeout=10)
    assert r.status_code == 400 and "max_batch" in r.json()["error"]["message"]
    r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"batch": {"name": "fifo"}}, timeout=10)
    assert r.status_code == 400
    assert httpx.get(f"{cluster.url}/v1/admin/policy", timeout=10).json() == before


def test_bench_presets_replace_whole_sections_so_no_knob_lingers(cluster, policy):
    """PUT /v1/admin/policy merges a section's knobs into the current ones; the bench applies each preset's
    sections in full, so the easerve preset after the tierserve one is not left work-conserving."""
    from benchmarks.bench.presets import PRESETS, apply_policy

    with httpx.Client(base_url=cluster.url, timeout=10) as admin:
        apply_policy(admin, PRESETS["tierserve"].policy, "tierserve")
        assert admin.get("/v1/admin/policy").json()["batch"]["work_conserving"] is True
        apply_policy(admin, PRESETS["easerve"].policy, "easerve")
        batch = admin.get("/v1/admin/policy").json()["batch"]
    assert batch["work_conserving"] is False and batch["name"] == "adaptive"
