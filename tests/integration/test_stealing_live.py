"""Work stealing on the live cluster: the encode GPU's combined worker serves whole requests while the
encoder is idle, gives the same greedy answers, and takes nothing when stealing is off."""

from __future__ import annotations

import time

import httpx
import pytest
from media_factory import data_url, image_bytes

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _ask(cluster, i: int) -> dict:
    r = httpx.post(f"{cluster.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny-llava", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(image_bytes(i, 48, 48))}}, {"type": "text", "text": "what?"}]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    return {"worker": body["tierserve"]["prefill_worker"], "text": body["choices"][0]["message"]["content"]}


def _stealing(cluster, **knobs) -> None:
    r = httpx.put(f"{cluster.url}/v1/admin/policy", json={"stealing": knobs}, timeout=10)
    assert r.status_code == 200 and r.json()["stealing"]["enabled"] == knobs["enabled"], r.text
    time.sleep(1.2)  # encode workers re-read the policy at most once a second


def _stats(cluster) -> dict[str, dict]:
    return {w["worker_id"]: w["stats"] for w in httpx.get(f"{cluster.url}/v1/cluster", timeout=10).json()["workers"]}


def test_idle_encoder_steals_whole_requests_with_identical_answers(cluster):
    off = [_ask(cluster, i) for i in range(4)]
    assert "llm-steal-0" not in {o["worker"] for o in off}
    try:
        _stealing(cluster, enabled=True, remote_load_threshold=0, max_stolen=4)
        on = [_ask(cluster, i) for i in range(4)]  # one at a time: the encode queue is always empty
    finally:
        _stealing(cluster, enabled=False)
    assert [o["worker"] for o in on] == ["llm-steal-0"] * 4
    assert [o["text"] for o in on] == [o["text"] for o in off]  # same weights, same greedy tokens
    time.sleep(2.5)  # the next heartbeats carry the stats
    stats = _stats(cluster)
    assert stats["encode-0"]["stolen_total"] >= 4 and stats["llm-steal-0"]["stolen_steps"] >= 4 * 6
    assert stats["llm-steal-0"]["stolen_seconds"] > 0
    metrics = httpx.get(f"{cluster.url}/metrics", timeout=10).text
    assert 'worker="llm-steal-0"' in metrics and 'stat="stolen_seconds"' in metrics
    for stat in ("encode_queue_batches", "encode_gate_wait_max_s", "stolen_total", "sm_partition_supported"):
        assert f'worker="encode-0",stat="{stat}"' in metrics or f'stat="{stat}",worker="encode-0"' in metrics, stat


def test_an_idle_remote_tier_is_not_stolen_from(cluster):
    try:
        _stealing(cluster, enabled=True, remote_load_threshold=50)  # remote workers hold far fewer
        assert "llm-steal-0" not in {_ask(cluster, i)["worker"] for i in range(3)}
    finally:
        _stealing(cluster, enabled=False)
