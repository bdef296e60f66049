"""The live trial backend: applying a trial's knobs through the real coordinator app's PUT /v1/admin/policy
(FastAPI TestClient, real Redis), and handing the replay to its Replayer (a whole live trial against
real workers is in test_replay.py)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from plan_factories import outcome

from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.planner.allocation import parse_allocation
from coordinator.planner.goodput import SLO, Summary
from coordinator.planner.live import LiveBackend, LiveTrialError, apply_policy
from coordinator.planner.space import Knobs, TrialConfig
from coordinator.planner.workload import ArrivalProcess, Workload
from coordinator.policies.base import PolicyConfig

pytestmark = pytest.mark.redis

DEPLOYED = parse_allocation("1xL4:E+P,1xL4:P,1xL4:D")
SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
WORKLOAD = Workload(arrivals=ArrivalProcess(rate=2.0))


@pytest.fixture
def client(redis_url, key_prefix):
    app = create_app(CoordinatorConfig(redis_url=redis_url, key_prefix=key_prefix, admin_token="sesame"))
    with TestClient(app) as c:
        yield c


def backend(client, **kwargs) -> LiveBackend:
    return LiveBackend(client, DEPLOYED, cost_per_hour=2.43, workload=WORKLOAD, slo=SLO_, admin_token="sesame",
                       sleep=lambda s: None, **kwargs)


def test_apply_puts_every_knob_in_force(client):
    knobs = Knobs(batch=4, s=0.35, split="static-0.75", stealing=True)
    applied = backend(client).apply(TrialConfig(allocation=DEPLOYED, knobs=knobs))
    assert applied == knobs.policy()
    now = PolicyConfig.model_validate(client.get("/v1/admin/policy", headers={"Authorization": "Bearer sesame"}).json())
    assert now == knobs.policy()
    # a later trial resets what it does not set: sections are sent whole
    backend(client).apply(TrialConfig(allocation=DEPLOYED, knobs=Knobs(batch=1)))
    now = PolicyConfig.model_validate(client.get("/v1/admin/policy", headers={"Authorization": "Bearer sesame"}).json())
    assert now == Knobs(batch=1).policy() and not now.stealing.enabled


def test_wrong_token_is_a_clear_error(client):
    with pytest.raises(LiveTrialError, match="answered 401.*--admin-token"):
        apply_policy(client, PolicyConfig(), admin_token="wrong")


def test_another_allocation_needs_a_redeploy(client):
    other = TrialConfig(allocation=parse_allocation("1xL4:E,1xL4:P+D"), knobs=Knobs(batch=2))
    with pytest.raises(LiveTrialError, match="only changes knobs"):
        backend(client).apply(other)


def test_evaluate_applies_then_replays_through_the_default_replayer(client):
    from coordinator.planner.replay import HttpReplayer

    b = backend(client)
    assert isinstance(b.replayer, HttpReplayer) and b.replayer.url == "http://testserver"
    config = TrialConfig(allocation=DEPLOYED, knobs=Knobs(batch=3, s=0.5))
    # The TestClient serves no real socket, so the replay cannot connect: a clear error, after the knobs.
    with pytest.raises(LiveTrialError, match="the replay failed: cannot reach the coordinator at http://testserver"):
        b.evaluate(config)
    now = client.get("/v1/admin/policy", headers={"Authorization": "Bearer sesame"}).json()
    assert now["batch"]["max_batch"] == 3 and now["offload"]["s"] == 0.5


def test_evaluate_with_a_replayer_scores_its_summary(client):
    o = outcome(3600.0, cost=2.43)

    class Replayer:
        def replay(self, workload, requests, seed, slo):
            assert (workload, requests, seed, slo) == (WORKLOAD, 100, 0, SLO_)
            return Summary(requests=100, good=100, duration_s=100 / o.goodput_rps, throughput_rps=o.goodput_rps,
                           goodput_rps=o.goodput_rps, slo_attainment=1.0, ttft_p50_s=0.2, ttft_p99_s=0.4,
                           ttft_mean_s=0.25, tpot_mean_s=0.02, tpot_p99_s=0.03, mean_encode_batch=1.0,
                           node_utilisation={}, stage_utilisation={}, cost_per_hour=2.43, cost_per_goodput=None)

    got = backend(client, replayer=Replayer()).evaluate(TrialConfig(allocation=DEPLOYED, knobs=Knobs(batch=2, s=0.4)))
    assert got.backend == "live" and got.objective == pytest.approx(3600.0)


def test_unreachable_coordinator():
    import httpx

    with httpx.Client(base_url="http://127.0.0.1:9", timeout=0.5) as c, pytest.raises(LiveTrialError,
                                                                                         match="cannot reach"):
        apply_policy(c, PolicyConfig())
