"""The workload monitor on a real Redis: per-second counters, retention, windows, goodput, the admin endpoint."""

from __future__ import annotations

import httpx
import pytest
import redis.asyncio as aioredis

from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.oserve.flight_watch import MonitoredFlightBook
from coordinator.oserve.keys import OServeKeys
from coordinator.oserve.monitor import MonitorConfig, WorkloadMonitor
from coordinator.planner.goodput import SLO
from coordinator.protocol.messages import Holder, MediaRef, SamplingParams, TokenEvent
from coordinator.flights import Flight

pytestmark = pytest.mark.redis
T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def r(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_counts_flush_per_second_and_read_back_as_a_window(r, key_prefix):
    clock = FakeClock()
    m = WorkloadMonitor(r, key_prefix, MonitorConfig(retention_s=60, slo=SLO(ttft_s=1.0, tpot_s=0.1)), clock)
    for _ in range(3):
        m.arrived("image", 2, 100)
    m.arrived("video", 1, 400)
    m.finished(True, 0.5, 0.05, 8)  # good
    m.finished(True, 1.5, 0.05, 8)  # too slow a first token
    m.finished(False, None, None, 0)
    assert await m.flush(in_flight=4) == 1  # the gauges of the second before; this second is not over
    clock.t += 1
    m.arrived("image", 1, 100)
    assert await m.flush(in_flight=2, dispatch_queue=1) == 1
    clock.t += 1
    assert await m.flush() == 1
    w = await m.window(2)
    assert [row["t"] for row in w.per_second] == [int(T0), int(T0) + 1]
    s = w.summary()
    assert s["rate"] == pytest.approx(2.5) and s["mix"] == pytest.approx({"image": 0.8, "video": 0.2})
    assert s["modality_rates"] == pytest.approx({"image": 2.0, "video": 0.5})
    assert s["items_per_request"] == pytest.approx(8 / 5) and s["prompt_tokens_mean"] == pytest.approx(800 / 5)
    assert s["goodput"] == pytest.approx(0.5) and s["slo_attainment"] == pytest.approx(1 / 3)
    assert s["failed_per_s"] == pytest.approx(0.5) and s["output_tokens_mean"] == pytest.approx(16 / 3)
    assert s["in_flight_mean"] == pytest.approx(1.0)  # 2 sampled at the end of second 0, 0 at the end of second 1
    ttl = await r.ttl(OServeKeys(key_prefix).workload(int(T0)))
    assert 0 < ttl <= 60
    with pytest.raises(ValueError, match="1 to 60 seconds"):
        await m.window(61)


async def test_two_coordinators_add_up(r, key_prefix):
    clock = FakeClock()
    a, b = (WorkloadMonitor(r, key_prefix, clock=clock) for _ in range(2))
    a.arrived("image", 1, 10)
    b.arrived("image", 1, 10)
    clock.t += 1
    await a.flush()
    await b.flush()
    assert (await a.window(1)).summary()["rate"] == 2.0


async def test_flight_book_reports_ttft_tpot_and_outcome(r, key_prefix):
    clock = FakeClock()
    m = WorkloadMonitor(r, key_prefix, MonitorConfig(slo=SLO(ttft_s=1.0, tpot_s=0.1)), clock)
    book = MonitoredFlightBook(m)
    good = Flight("a", [1, 2, 3], SamplingParams(), [MediaRef(key="k", kind="image")], T0)
    late = Flight("b", [1], SamplingParams(), [], T0)
    book.add(good)
    book.add(late)
    clock.t += 0.4
    book.route(TokenEvent(request_id="a", attempt=0, index=0, token_ids=[7]))
    book.route(TokenEvent(request_id="a", attempt=0, holder=Holder(worker_id="w", instance="i")))  # a hand-off
    clock.t += 0.1
    book.route(TokenEvent(request_id="a", attempt=0, index=1, token_ids=[8, 9], finish_reason="stop"))
    clock.t += 1.0
    book.route(TokenEvent(request_id="b", attempt=0, index=0, token_ids=[5], finish_reason="length"))
    book.remove("a")
    book.remove("b")
    book.remove("b")  # twice is harmless
    clock.t += 1
    await m.flush()
    s = (await m.window(2)).summary()
    assert s["mix"] == {"image": 0.5, "text": 0.5}
    assert s["finished_per_s"] == 1.0 and s["goodput"] == 0.5  # b's first token came after 1.5 s
    assert s["output_tokens_mean"] == 2.0


async def test_workload_endpoint_validates_its_window(redis_url, key_prefix):
    app = create_app(CoordinatorConfig(redis_url=redis_url, key_prefix=key_prefix))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1:8000") as c:
            bad = [await c.get("/v1/admin/workload", params={"window": w}) for w in ("0", "abc", "1e9", "3601")]
            ok = await c.get("/v1/admin/workload", params={"window": "5"})
            metrics = await c.get("/metrics")
    for resp in bad:
        assert resp.status_code == 400 and "window must be" in resp.json()["error"]["message"]
    body = ok.json()
    assert ok.status_code == 200 and body["window_s"] == 5 and len(body["per_second"]) == 5
    assert body["summary"]["rate"] == 0 and body["slo"] == {"ttft_s": 2.0, "tpot_s": 0.2}
    assert "tierserve_workload_goodput" in metrics.text
