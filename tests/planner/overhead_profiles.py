"""A tiny-llava CPU profile with the overheads a test gives it, and a simulation of it: shared by the tests of the
overheads the simulator applies (test_sim_admission.py, test_kv_hop.py)."""

from __future__ import annotations

from coordinator.planner.arch import get_arch
from coordinator.planner.catalog import load_catalog
from coordinator.planner.deployment import Deployment
from coordinator.planner.goodput import RequestRecord
from coordinator.planner.perf import PerfModel
from coordinator.planner.profile import Profile, ProfileOverheads
from coordinator.planner.sim import Simulator
from coordinator.planner.workload import SimRequest

TINY = get_arch("tiny-llava")


def profile(**overheads) -> Profile:
    return Profile(tier="cpu", model="tiny-llava", measured_at="2026-12-06",
                   encode={"image": {"tokens_per_item": 196, "points": [{"batch": 1, "seconds": 0.01}]}},
                   prefill=[{"tokens": 100, "seconds": 0.01}, {"tokens": 400, "seconds": 0.03}],
                   decode=[{"batch": 1, "context_tokens": 100, "seconds": 0.003},
                           {"batch": 2, "context_tokens": 400, "seconds": 0.004}],
                   overheads=ProfileOverheads(**overheads))


def run(spec: str, p: Profile, requests: list[SimRequest]) -> tuple[PerfModel, list[RequestRecord]]:
    """`requests` through deployment `spec` on `p`'s measured times: the model and the records."""
    perf = PerfModel(load_catalog(), TINY, [p])
    sim = Simulator(Deployment.parse(spec), perf, kv_bytes_per_token=TINY.kv_bytes_per_token(),
                    embedding_bytes_per_token=TINY.embedding_bytes(1))
    return perf, sim.run(requests).records
