"""An image request's encode job leaves before its prompt is built (coordinator/prompt_ahead.py), on the shared
real cluster: the prompt reaches the encode worker, and a request whose build fails after its job left gets the
same 4xx as before while the encoder drops the job at once (the next request is not held behind it)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from media_factory import data_url, image_bytes

from encode_node.prompts import PROMPT_WAIT_S

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _body(raw: bytes, mime: str = "image/png", **extra) -> dict:
    return {"model": "tiny-llava", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(raw, mime)}}, {"type": "text", "text": "what is this?"}]}],
            **extra}


def test_the_job_leaves_before_the_prompt_is_built(cluster):
    r = httpx.post(f"{cluster.url}/v1/chat/completions", json=_body(image_bytes(11, 64, 64)), timeout=30)
    assert r.status_code == 200, r.text
    hops = [h.split("->") for h in r.json()["tierserve"]["stages_s"]]
    order = [a for a, _ in hops] + [hops[-1][1]]
    assert order.index("submitted") < order.index("prompt_built") < order.index("embeddings_sent"), order


@pytest.mark.parametrize("case", ["corrupt body", "prompt too long"])
def test_a_build_that_fails_after_the_job_left_is_answered_and_the_job_dropped(cluster, case):
    jpeg = image_bytes(12, 200, 200, fmt="JPEG")
    bad = (_body(jpeg[: len(jpeg) // 2], "image/jpeg") if case == "corrupt body"
           else _body(jpeg, "image/jpeg", max_tokens=100_000))
    good = _body(image_bytes(13, 64, 64))
    log_path = cluster.log_dir / "encode-0.log"
    seen = len(log_path.read_bytes())

    async def both():
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
            async def timed(body):
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body)
                return r, time.perf_counter() - t0
            return await asyncio.gather(timed(bad), timed(good))

    (refused, _), (ok, seconds) = asyncio.run(both())
    assert refused.status_code == 400, refused.text
    assert ("image is corrupt" if case == "corrupt body" else "exceeds the model's context") \
        in refused.json()["error"]["message"]
    assert ok.status_code == 200, ok.text
    assert seconds < PROMPT_WAIT_S / 2, f"the request beside it took {seconds:.1f} s"
    # The encoder drops a refused job; one whose image does not decode it fails itself, as it always did.
    dropped = "requests failed" if case == "corrupt body" else "answered before its prompt was built"
    deadline = time.monotonic() + 5
    while dropped not in (log := log_path.read_bytes()[seen:].decode()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dropped in log
