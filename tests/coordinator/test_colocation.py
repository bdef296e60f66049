"""The shared-memory channel between an encode worker and the LLM workers on its GPU, across processes."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from coordinator.protocol.colocation import ColocationChannel, channel_path

STEP_S = 0.05


def _stealer(path: str, steps: int, started, out) -> None:
    """A stand-in engine loop: one STEP_S 'step' at a time, only when the channel allows it."""
    ch = ColocationChannel(Path(path))
    started.set()
    ran = deferred = 0
    deadline = time.monotonic() + 20
    while ran < steps and time.monotonic() < deadline:
        if ch.step_begin():
            time.sleep(STEP_S)
            ch.step_end()
            ran += 1
        else:
            deferred += 1
            time.sleep(0.002)
    out.put((ran, deferred))
    ch.close()


def test_paths_are_per_prefix_and_encoder(tmp_path):
    a = channel_path("p1", "encode-0", tmp_path)
    assert a != channel_path("p2", "encode-0", tmp_path) != channel_path("p1", "encode-1", tmp_path)
    assert channel_path("we/ird", "e 0", tmp_path).parent == tmp_path


def test_encoder_waits_at_most_one_step_of_stolen_work(tmp_path):
    path = channel_path("t", "encode-0", tmp_path)
    enc = ColocationChannel(path)
    ctx = mp.get_context("spawn")
    started, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_stealer, args=(str(path), 40, started, out))
    child.start()
    try:
        assert started.wait(30)
        waits = []
        for _ in range(8):
            time.sleep(STEP_S * 1.5)  # let the stealer get into a step
            waits.append(enc.encoder_enter())
            hold_until = time.monotonic() + 0.1
            while time.monotonic() < hold_until:  # the stealer must not run while we hold the GPU
                assert enc.encoder_busy
                time.sleep(0.01)
            enc.encoder_exit(more_batches_waiting=False)
        ran, deferred = out.get(timeout=30)
    finally:
        child.join(30)
    assert ran == 40 and deferred > 0  # it was held back while we encoded, and finished afterwards
    assert max(w.seconds for w in waits) <= STEP_S + 0.03, waits  # never more than the one step already running
    assert sum(w.seconds > 0.005 for w in waits) >= 2, waits  # and it did run concurrently: some batches did wait
    assert all(w.steps <= 1 for w in waits), waits  # no second step began while a batch waited
    for w in (w for w in waits if w.seconds > 0.005):  # the step waited on is the one the channel reports
        assert STEP_S * 0.9 <= w.step_s <= STEP_S + 0.03 and w.seconds <= w.step_s + 0.003, w


def test_busy_flag_stays_up_while_batches_queue(tmp_path):
    ch = ColocationChannel(channel_path("t", "e", tmp_path))
    other = ColocationChannel(ch.path)
    ch.encoder_enter()
    ch.encoder_exit(more_batches_waiting=True)
    assert other.step_begin() is False  # the next batch is already queued: no stolen step in between
    ch.encoder_enter()
    ch.encoder_exit(more_batches_waiting=False)
    assert other.step_begin() is True
    other.step_end()


def test_split_backlog_and_held_travel_between_handles(tmp_path):
    enc = ColocationChannel(channel_path("t", "e", tmp_path))
    llm = ColocationChannel(enc.path)
    assert llm.read_split().seq == 0
    enc.publish_split(40, 26, "dynamic")
    first = llm.read_split()
    assert (first.encoder_tpcs, first.prefill_tpcs, first.mode) == (40, 26, "dynamic")
    enc.publish_split(33, 33, "static")
    assert llm.read_split().seq == first.seq + 1
    llm.set_prefill_backlog(1234)
    llm.set_stolen_held(3)
    assert (enc.prefill_backlog(), enc.stolen_held()) == (1234, 3)
    llm.set_prefill_backlog(-5)
    assert enc.prefill_backlog() == 0


@pytest.mark.parametrize("size", [0, 10])
def test_a_short_or_new_file_is_grown(tmp_path, size):
    path = tmp_path / "x.gpu"
    path.write_bytes(b"\0" * size)
    ch = ColocationChannel(path)
    assert ch.encoder_busy is False and ch.prefill_backlog() == 0
