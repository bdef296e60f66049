"""The encode worker's routing: steal, local prefill (share s) or remote, from the registry's view."""

from __future__ import annotations

import pytest

from coordinator.policies.base import OffloadConfig, PolicyConfig
from coordinator.policies.work_stealing import WorkStealingConfig
from coordinator.protocol.messages import EncodeJob, SamplingParams, Timing, WorkerInfo
from coordinator.protocol.registry import WorkerStatus
from coordinator.submit import text_targets
from encode_node.routing import RequestRouter, Targets


def worker(wid: str, role: str, colocated_with: str | None = None, load: int = 0) -> WorkerStatus:
    info = WorkerInfo(worker_id=wid, role=role, tier="cpu", host="h", pid=1, model="m", started_at=0.0,
                      colocated_with=colocated_with)
    return WorkerStatus(info=info, heartbeat_age_s=0.0, load=load)


def job(i: int, pin: str | None = None) -> EncodeJob:
    return EncodeJob(request_id=f"r{i}", prompt_token_ids=[1, 2], sampling=SamplingParams(), arrival=0.0, media=[],
                     timing=Timing(), prefill_worker=pin)


CLUSTER = [worker("remote", "combined", load=3), worker("local", "prefill", "enc-0"), worker("steal", "combined", "enc-0"),
           worker("other-local", "prefill", "enc-1"), worker("other-steal", "combined", "enc-1")]


def test_targets_are_sorted_by_where_they_run():
    t = Targets.sort(CLUSTER, "enc-0")
    assert [w.info.worker_id for w in t.remote] == ["remote"]
    assert [w.info.worker_id for w in t.local] == ["local"]
    assert [w.info.worker_id for w in t.steal] == ["steal"]


def route(router: RequestRouter, n: int, pending: int = 0, held: int = 0) -> list[str | None]:
    t = Targets.sort(CLUSTER, "enc-0")
    router.observe(t, pending, held, 0.0)
    return [(w.info.worker_id if (w := router.choose(job(i), t, 0.0)) else None) for i in range(n)]


def test_stealing_keeps_up_to_the_cap_then_offload_decides():
    r = RequestRouter("enc-0")
    assert r.configure(PolicyConfig(offload=OffloadConfig(s=1.0), stealing=WorkStealingConfig(enabled=True, max_stolen=2)))
    assert route(r, 4, held=1) == ["steal", "local", "local", "local"]
    assert r.stats()["stolen_total"] == 1.0


def test_no_stealing_while_batches_queue_or_when_disabled():
    r = RequestRouter("enc-0")
    r.configure(PolicyConfig(stealing=WorkStealingConfig(enabled=True)))
    assert route(r, 2, pending=1) == ["remote", "remote"]
    r.configure(PolicyConfig())
    assert route(r, 2) == ["remote", "remote"]
    assert r.configure(PolicyConfig()) is False


def test_a_pinned_worker_wins():
    r = RequestRouter("enc-0")
    t = Targets.sort(CLUSTER, "enc-0")
    r.observe(t, 0, 0, 0.0)
    assert r.choose(job(0, pin="other-local"), t, 0.0).info.worker_id == "other-local"


@pytest.mark.parametrize(("alive", "stealing", "expected"), [
    (CLUSTER, True, {"remote"}),
    ([w for w in CLUSTER if w.info.worker_id != "remote"], False, {"local", "other-local"}),
    ([w for w in CLUSTER if w.info.role == "combined" and w.info.colocated_with], False, set()),
    ([w for w in CLUSTER if w.info.role == "combined" and w.info.colocated_with], True, {"steal", "other-steal"}),
])
def test_text_only_requests_prefer_remote_workers(alive, stealing, expected):
    policy = PolicyConfig(stealing=WorkStealingConfig(enabled=stealing))
    assert {w.info.worker_id for w in text_targets(alive, policy)} == expected


def _sides(local_load: int, remote_load: int, saturation: int | None, n: int = 10) -> list[str | None]:
    r = RequestRouter("enc-0")
    r.configure(PolicyConfig(offload=OffloadConfig(s=0.5, saturation_load=saturation)))
    t = Targets.sort([worker("remote", "combined", load=remote_load), worker("local", "prefill", "enc-0", load=local_load)],
                     "enc-0")
    return [(w.info.worker_id if (w := r.choose(job(i), t, 0.0)) else None) for i in range(n)]


def test_a_saturated_side_falls_back_to_the_other():
    assert _sides(local_load=8, remote_load=0, saturation=8) == ["remote"] * 10
    assert _sides(local_load=0, remote_load=9, saturation=8) == ["local"] * 10
    assert _sides(local_load=8, remote_load=8, saturation=8).count("local") == 5   # both full: s holds
    assert _sides(local_load=8, remote_load=0, saturation=None).count("local") == 5  # no cap: load is ignored
