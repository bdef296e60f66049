"""benchmarks/timer_interrupts.py: how much of the delay a process beside a worker causes lands inside the worker's
forward timer, measured with real processes pinned to one core."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.timer_interrupts import main


@pytest.mark.slow
def test_a_process_beside_the_worker_on_its_core_shows_up_in_its_timer(tmp_path):
    """A decode step timed beside the stack's kind of work on the same core: the steps run longer off the CPU than
    alone (were the pin lost on this 2-core host, the two would run side by side and the timer would see nothing), and
    the share seen is the delay inside over the delay inside and before."""
    out = tmp_path / "interrupts.json"
    core = min(os.sched_getaffinity(0))
    assert main(["--pairs", "decode+stack", "--rounds", "1", "--seconds", "1.5", "--core", str(core),
                 "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    (row,) = rep["pairs"]
    (rnd,) = row["rounds"]
    assert rep["command"].startswith("python -m benchmarks.timer_interrupts") and row["pair"] == "decode+stack"
    alone = sum(r["off_cpu_ms"] for r in rnd["alone"]) / 2
    assert rnd["beside"]["off_cpu_ms"] > alone and rnd["inside_ms"] > 0
    assert rnd["seen"] == pytest.approx(rnd["inside_ms"] / (rnd["inside_ms"] + rnd["before_ms"]), abs=1e-3)
    assert all(r["ops"] >= 20 for r in (*rnd["alone"], rnd["beside"]))


@pytest.mark.parametrize("argv, says", [(["--pairs", "stack+decode"], "a pair is TIMED+OTHER"),
                                         (["--duty", "1"], "--duty between 0 and 1"),
                                         (["--core", "4096"], "is not one this process may run on")])
def test_bad_arguments_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err
