"""The KV hand-off's latency (ProfileOverheads.kv_hop_s), timed on a running cluster with a prefill/decode pair.

`tierserve profile` measures on one encode and one combined worker, where nothing hands a KV cache over: its
hop_s is the embeddings' hand-over (encode -> prefill). A prefill worker's hand-off to a decode worker is
another path (the prefill worker looks a decode worker up, delivers the KV tensors, pushes the decode job; the
decode worker takes it in), and it took 3.5-3.9 ms live at p50 where hop_s read 1.4 ms on the same host
(benchmarks/results/sim_fidelity_s29). So it is timed where it happens: requests streamed one at a time to a
cluster whose requests go prefill -> decode, each request's own marks giving first token -> decode admitted, the
median kept. Idle like the profile's other phases (a pause before each request), so it is the hand-off's own
latency; queueing for the decode worker is the simulator's to add.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from coordinator.planner.live_http import LiveClusterError, chat_body, get_json, served_model
from coordinator.planner.profile import Profile
from coordinator.planner.profiling_phases import median
from coordinator.planner.replay import ReplayRecord, stream_request
from coordinator.planner.workload import SimRequest

__all__ = ["check_pair", "kv_hop_samples", "measure_kv_hop", "with_kv_hop"]

HAND_OFF = ("first_token", "decode_admitted")
"""The marks a hand-off is timed between (the usage chunk's tierserve.stages_s)."""


def check_pair(workers: list[dict], url: str) -> None:
    """Refuse a cluster where no request can hand a KV cache over: it needs a decode worker, and a prefill
    worker or an encode worker's co-located prefill to hand to it."""
    roles = {w.get("role") for w in workers}
    if "decode" not in roles or not roles & {"prefill", "encode"}:
        raise LiveClusterError(f"{url} runs workers {sorted(r for r in roles if r)}: timing the KV hand-off needs a "
                               f"decode worker and a prefill worker to hand to it (e.g. `tierserve up --llm "
                               f"prefill,decode`)")


async def kv_hop_samples(client: httpx.AsyncClient, model: str, requests: int = 30, warmup: int = 3,
                         pause_s: float = 0.1, output_tokens: int = 8, words: int = 4) -> list[float]:
    """Seconds from the first token to the decode worker's admission, one per streamed request that was handed
    off (`warmup` requests first, not kept), up to `requests` of them; each request waits `pause_s` first, so
    each finds the cluster idle."""
    if requests < 1 or output_tokens < 2:
        raise ValueError(f"timing the KV hand-off needs at least one request of two tokens or more (a one-token "
                         f"answer is not handed off), got requests={requests}, output_tokens={output_tokens}")
    out: list[float] = []
    tries = warmup + 3 * requests  # a layout may prefill some requests on a combined worker: no hand-off
    for i in range(tries):
        if len(out) == requests:
            break
        await asyncio.sleep(pause_s)
        record = ReplayRecord(SimRequest(i, 0.0, "image", 1, 1, words, output_tokens))
        await stream_request(client, record, chat_body(model, words, 1, output_tokens, stream=True),
                             time.perf_counter(), 0.0)
        if record.error is not None:
            raise LiveClusterError(f"a request failed while timing the KV hand-off: {record.error}")
        if i >= warmup and set(HAND_OFF) <= record.marks.keys():
            out.append(record.marks["decode_admitted"] - record.marks["first_token"])
    if not out:
        raise LiveClusterError(f"none of {tries} answers has the {' / '.join(HAND_OFF)} marks: no request was "
                               f"handed from a prefill to a decode worker (is the decode worker taking work?)")
    return out


async def measure_kv_hop(url: str, requests: int = 30, admin_token: str | None = None,
                         timeout_s: float = 120.0) -> tuple[float, list[float]]:
    """(median, samples) of the KV hand-off on the cluster at `url` (check_pair says which clusters have one)."""
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=headers) as c:
        check_pair((await get_json(c, "/v1/cluster")).get("workers", []), url)
        samples = await kv_hop_samples(c, await served_model(c), requests)
    return max(0.0, median(samples)), samples


def with_kv_hop(profile: Profile, kv_hop_s: float) -> Profile:
    """`profile` with its overheads' kv_hop_s set (a profile without overheads cannot carry one)."""
    if profile.overheads is None:
        raise ValueError("the profile has no overheads to add the KV hand-off to (was it measured with them?)")
    return profile.model_copy(update={"overheads": profile.overheads.model_copy(update={"kv_hop_s": kv_hop_s})})
