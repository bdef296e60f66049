"""Where the live runs' processes ran (sim_fidelity_host.CoreSampler) and how the layouts benchmark reads
it (stack_shares): CPU time, in cores, never more than the wall time on one core; old samples read right."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.sim_fidelity_host import METHOD, CoreSampler
from benchmarks.sim_fidelity_layouts import LAYOUTS, stack_shares


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_thread_pinned_to_one_core_is_charged_its_cpu_time_there_at_most_one_core():
    core = sorted(os.sched_getaffinity(0))[0]
    done, spun = threading.Event(), threading.Event()

    def work() -> None:  # born after the sampler's first sample: all of its CPU time counts
        os.sched_setaffinity(0, {core})
        _spin(0.3)
        spun.set()
        done.wait(5)  # alive at the last sample (a thread that ends loses at most one period)

    # hz=0.1: only the samples at enter and exit, so the thread is first seen at the last one.
    with CoreSampler({"me": [os.getpid()]}, hz=0.1) as sampler:
        t = threading.Thread(target=work)
        t.start()
        assert spun.wait(10)
    done.set()
    t.join()
    used = sampler.cpu["me"]
    assert used.get(core, 0.0) >= 0.27  # the 0.3 s spin (clock ticks are 10 ms)
    tick = 1 / os.sysconf("SC_CLK_TCK")  # CPU times come in clock ticks
    assert used[core] <= sampler._wall + 2 * tick  # no more than one core on one core
    assert sampler.shares()["me"][core] == round(used[core] / sampler._wall, 3)


def test_stack_shares_count_the_coordinator_once_in_runs_sampled_as_runnable_threads():
    layout = LAYOUTS["stealing"]
    run = {"cpu_by_core": {"llm-0-combined": {"1": 1.37}, "coordinator": {"0": 0.2, "1": 0.1},
                           "stack": {"0": 0.3, "1": 0.1}, "replayer": {"0": 0.1, "1": 0.1}}}
    report = {"live_affinity": {"llm-0-combined": [1], "coordinator": [0, 1]},
              "cells": [{"live_runs": [run | {"cpu_by_core_method": "runnable"}]}]}
    # stack minus coordinator is Redis: core 0 gets 0.2 + 0.1 + 0.1, core 1 0.1 + 0.0 + 0.1.
    assert stack_shares(report, layout) == {"0-E-cpu": round(0.4 / 0.6, 4), "1-P+D-cpu": round(0.2 / 0.6, 4)}
    # Sampled as CPU time the groups hold disjoint processes: every group counts as it is.
    report["cells"][0]["live_runs"][0]["cpu_by_core_method"] = METHOD
    assert stack_shares(report, layout) == {"0-E-cpu": round(0.6 / 0.9, 4), "1-P+D-cpu": round(0.3 / 0.9, 4)}
