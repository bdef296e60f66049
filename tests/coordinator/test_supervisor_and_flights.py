"""The restart bookkeeping of `tierserve up` and the coordinator's per-request memory, with fake clocks."""

from __future__ import annotations

import signal
import time

from coordinator.flights import GAP_WAIT_S, Flight
from coordinator.protocol.messages import Holder, SamplingParams, TokenEvent
from coordinator.supervisor import RestartPolicy, Supervisor, exit_cause


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_restarts_back_off_and_stop_at_the_limit():
    clock = Clock()
    sup = Supervisor(RestartPolicy(backoff_s=0.5, max_backoff_s=2.0, max_restarts=3, window_s=100), clock)
    delays = []
    for _ in range(3):
        msg, delay = sup.exited("encode-0", -signal.SIGKILL)
        assert "killed by SIGKILL" in msg and sup.waiting("encode-0")
        assert sup.due() == []  # not before its backoff
        clock.t += delay
        assert sup.due() == ["encode-0"] and sup.due() == []
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0]
    msg, delay = sup.exited("encode-0", 1)
    assert delay is None and "not restarting" in msg and "exit code 1" in msg
    clock.t += 1000
    assert sup.due() == [] and sup.waiting("encode-0")


def test_the_window_forgets_old_restarts():
    clock = Clock()
    sup = Supervisor(RestartPolicy(backoff_s=1, max_restarts=1, window_s=10), clock)
    _, delay = sup.exited("c", 1)
    clock.t += delay
    assert sup.due() == ["c"]
    clock.t += 11
    assert sup.exited("c", 1)[1] == 1  # the earlier restart left the window
    assert exit_cause(-9) == "killed by SIGKILL" and exit_cause(3) == "exit code 3"


def _flight() -> Flight:
    return Flight("r1", [1, 2, 3], SamplingParams(max_tokens=8), [], 0.0)


def _ev(attempt=0, index=0, tokens=(), finish=None, holder=None) -> TokenEvent:
    return TokenEvent(request_id="r1", attempt=attempt, index=index, token_ids=list(tokens), finish_reason=finish,
                      holder=holder)


def test_a_flight_takes_only_its_current_attempt_and_moves_its_holder():
    f = _flight()
    f.accept(_ev(holder=Holder(worker_id="p0", instance="a")))
    assert f.holder.worker_id == "p0" and f.events.empty()
    f.accept(_ev(tokens=[7], index=0))
    f.attempt = 1  # a re-run: what the old run still publishes is ignored
    f.accept(_ev(attempt=0, index=1, tokens=[8]))
    f.accept(_ev(attempt=1, index=1, tokens=[9], finish="length"))
    got = [f.events.get_nowait().token_ids for _ in range(f.events.qsize())]
    assert got == [[7], [9]] and f.output_token_ids == [7, 9] and f.done


def test_a_gap_marks_the_flight_for_a_rerun_only_once_it_waited_and_a_repeat_is_dropped():
    f = _flight()
    f.accept(_ev(tokens=[5, 6], index=0))
    f.accept(_ev(tokens=[6], index=1))  # a retried write landed twice
    assert f.output_token_ids == [5, 6] and not f.broken
    f.accept(_ev(tokens=[9], index=4))  # tokens 2 and 3 never arrived
    assert f.output_token_ids == [5, 6] and f.gap_since is not None
    assert not f.gap_overdue(f.gap_since + GAP_WAIT_S / 2) and not f.broken
    assert f.gap_overdue(f.gap_since + GAP_WAIT_S + 0.01) and f.broken
    f.accept(_ev(tokens=[7, 8], index=2))  # too late: the re-run continues from what the client has
    assert f.output_token_ids == [5, 6]
    f.restart()
    assert not f.broken and not f.ahead and f.gap_since is None


def test_events_that_overtook_others_wait_for_them_and_go_out_in_order():
    f = _flight()
    f.accept(_ev(tokens=[1], index=0))
    f.accept(_ev(tokens=[4], index=3, finish="length"))  # the last frame, over the direct link
    f.accept(_ev(tokens=[3], index=2))
    assert f.output_token_ids == [1] and not f.done
    f.accept(_ev(tokens=[2, 3], index=1))  # the stream's copy, overlapping what waits
    got = [f.events.get_nowait().token_ids for _ in range(f.events.qsize())]
    assert got == [[1], [2, 3], [4]] and f.output_token_ids == [1, 2, 3, 4] and f.done
    assert not f.ahead and f.gap_since is None and not f.gap_overdue(time.monotonic() + 60)


async def test_fail_ends_the_stream_with_an_explicit_error():
    f = _flight()
    f.fail("worker w0 died and no other can take it")
    events = [ev async for ev in f.stream(1.0)]
    assert events[-1].finish_reason == "error" and "w0 died" in events[-1].error and f.unavailable
    f.accept(_ev(tokens=[1]))  # nothing more after the end
    assert f.events.empty()
