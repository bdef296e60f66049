"""benchmarks/worker_cpu.py's readings: a process's CPU seconds (process_profile.cpu_seconds, which it reads), and
which worker decoded each request."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.process_profile import cpu_seconds
from benchmarks.worker_cpu import main, per_request
from coordinator.planner.replay import ReplayRecord
from coordinator.planner.workload import SimRequest


def test_cpu_seconds_grow_with_work_and_not_with_sleep():
    before = cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        pass
    busy = cpu_seconds(os.getpid()) - before
    time.sleep(0.3)
    slept = cpu_seconds(os.getpid()) - before - busy
    assert busy == pytest.approx(0.3, abs=0.1)
    assert slept < 0.05


def test_a_request_handed_off_was_decoded_by_D_and_its_times_are_per_token():
    def record(marks, decode_s):
        r = ReplayRecord(SimRequest(0, 0.0, "image", 1, 1, 8, 11), sent=0.0, ttft=0.02, e2e=0.04, output_tokens=11)
        r.marks, r.compute = marks, {"decode_s": decode_s}
        return r

    rows = per_request([record({"first_token": 0.01, "handoff_sent": 0.012}, 0.015), record({"first_token": 0.01}, 0.01)])
    assert rows == [{"worker": "D", "tpot_ms": pytest.approx(2.0), "step_ms": pytest.approx(1.5)},
                    {"worker": "P+D", "tpot_ms": pytest.approx(2.0), "step_ms": pytest.approx(1.0)}]


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--batches", "0"], ["--output-tokens", "1"]])
def test_bad_arguments_are_refused(args):
    with pytest.raises(SystemExit):
        main(args)
