"""The direct links on a live cluster (real processes, authenticated with the launcher's cluster secret): the
coordinator writes micro-batches to the encode worker over its job link and the LLM workers write their tokens to
the coordinator over reply links, every path (combined, prefill -> decode, co-located prefill) included. The
streams-only path is checked on test_multimodal.py's audio cluster (--no-direct-links)."""

from __future__ import annotations

import re

import httpx
import pytest
from media_factory import data_url, image_bytes

pytestmark = [pytest.mark.redis]


def link_writes(url: str) -> dict[tuple[str, str], float]:
    """tierserve_link_writes_total by (kind, path), from the coordinator's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(k, p): float(v) for k, p, v in re.findall(
        r'^tierserve_link_writes_total\{kind="(\w+)",path="(\w+)"\} (\S+)$', text, re.M)}


def test_batches_and_tokens_take_the_links_once_they_are_up(cluster):
    before = link_writes(cluster.url)
    for i in range(6):
        body = {"model": cluster.spec.model_name, "max_tokens": 6, "temperature": 0,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image_bytes(40 + i, 64, 64))}},
                    {"type": "text", "text": "what is this"}]}]}
        r = httpx.post(f"{cluster.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6, r.text
    after = link_writes(cluster.url)
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew.get(("job", "direct"), 0) >= 5, grew  # the first may go by the stream while the link opens
    assert grew.get(("reply", "direct"), 0) >= 5 * 6 // 2, grew
