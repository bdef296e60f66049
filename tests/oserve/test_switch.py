"""PlanSwitch's order of events, stepped by hand with an injected clock: the new layout is released whole before
anything retires, and a decode worker is asked to stop only once every other retiring worker (the prefill
workers that could still hand it a KV cache, the encoders that feed them) has exited."""

from __future__ import annotations

from coordinator.oserve.layout import Namer, Unit, diff
from coordinator.oserve.switch import PlanSwitch


class RecordingExecutor:
    """An executor whose processes are flags: the test decides when each registers and exits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.up: set[str] = set()
        self.exited: set[str] = set()

    def hold(self, worker_ids):
        self.events.append(("hold", *worker_ids))

    def release(self, worker_ids):
        self.events.append(("release", *worker_ids))

    def start(self, worker_id, role, colocated_with):
        self.events.append(("start", worker_id))

    def registered(self, worker_id):
        return worker_id in self.up

    def stop(self, worker_id):
        self.events.append(("stop", worker_id))

    def stopped(self, worker_id):
        return worker_id in self.exited


WIDE = [Unit(role="E", workers=("encode-0",)), Unit(role="E", workers=("encode-1",)),
        Unit(role="P", workers=("llm-1-prefill",)), Unit(role="D", workers=("llm-2-decode",))]


def test_back_to_combined_retires_the_decode_worker_only_after_the_prefill_and_encode_workers_exit():
    ex, now = RecordingExecutor(), [100.0]
    change = diff(WIDE, ["E", "P+D"])
    sw = PlanSwitch("s1", change, ex, Namer({w for u in WIDE for w in u.workers}), 99.0, lambda: now[0])
    sw.step()
    assert ex.events == [("hold", "llm-0-combined"), ("start", "llm-0-combined")] and sw.status.phase == "starting"
    now[0] = 110.0
    ex.up.add("llm-0-combined")
    sw.step()
    assert ex.events[2:] == [("release", "llm-0-combined"), ("stop", "encode-1"), ("stop", "llm-1-prefill")]
    assert sw.status.serving_at == 110.0 and sw.status.switch_s == 11.0
    ex.exited.add("encode-1")
    for _ in range(3):  # the prefill worker still drains: it may hand a KV cache to the decode worker
        sw.step()
    assert ("stop", "llm-2-decode") not in ex.events and sw.status.phase == "retiring"
    ex.exited.add("llm-1-prefill")
    sw.step()
    assert ex.events[-1] == ("stop", "llm-2-decode") and sw.status.phase == "retiring"
    ex.exited.add("llm-2-decode")
    now[0] = 130.0
    sw.step()
    assert sw.status.phase == "done" and sw.status.done_at == 130.0
    assert [u.role for u in sw.layout()] == ["E", "P+D"]


def test_new_workers_that_never_register_are_stopped_and_the_old_layout_stays():
    ex, now = RecordingExecutor(), [0.0]
    sw = PlanSwitch("s2", diff(WIDE, ["E", "P+D"]), ex, Namer(set()), 0.0, lambda: now[0], start_timeout_s=5.0)
    sw.step()
    now[0] = 6.0
    sw.step()
    assert sw.status.phase == "failed" and "did not register" in sw.status.error
    assert ("stop", "encode-1") not in ex.events and [u.role for u in sw.layout()] == ["E", "E", "P", "D"]
