"""The per-micro-batch SM split as the live workers apply it: encoder side -> shared channel -> prefill side.

The real libsmctrl needs an NVIDIA GPU; a stand-in library records the masks (see test_smctrl_wrapper.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from coordinator.policies.sm_partition import SMPartitionConfig, TPCSplit
from coordinator.protocol.colocation import ColocationChannel, GateWait, channel_path
from encode_node.gpu_share import EncoderGpuShare
from llm_node.gpu_share import LLMGpuShare
from native.smctrl import SMController
from native.stream_partition import StreamPartition
from native.tpc_mask import masks_for, to_words

ENC, PRE = 0x7F00_1000, 0x7F00_2000
TOTAL = 66  # the fake's TPC count (> 64: the 128-bit call)


def _calls(fake: Path) -> list[tuple[int, int, int]]:
    lib = ctypes.CDLL(str(fake))
    n = ctypes.c_int.in_dll(lib, "fake_ncalls").value
    streams = (ctypes.c_void_p * 16).in_dll(lib, "fake_streams")
    los, his = (ctypes.c_uint64 * 16).in_dll(lib, "fake_los"), (ctypes.c_uint64 * 16).in_dll(lib, "fake_his")
    return [(streams[i], los[i], his[i]) for i in range(min(n, 16))]


def _partition(fake: Path, shim_cache: Path, side: str, stream: int) -> StreamPartition:
    ctl = SMController(fake, cache_dir=shim_cache, check_driver=False)
    return StreamPartition("cuda:0", side, ctl, stream=lambda: stream)  # type: ignore[arg-type]


def test_a_cpu_device_runs_unpartitioned_and_says_why():
    part = StreamPartition("cpu", "encoder")
    assert not part.supported and "needs a CUDA GPU" in part.reason and part.total_tpcs is None
    assert part.apply(TPCSplit(1, 1, "static")) is False


def test_each_batch_split_reaches_both_streams(tmp_path, shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl(ext=True)
    ctypes.CDLL(str(fake)).fake_reset()
    path = channel_path("t", "encode-0", tmp_path)
    enc = EncoderGpuShare(ColocationChannel(path), _partition(fake, shim_cache, "encoder", ENC))
    enc.config = SMPartitionConfig(mode="dynamic", min_share=0.25)
    pre = LLMGpuShare(ColocationChannel(path), "prefill", _partition(fake, shim_cache, "prefill", PRE))

    pre.report(held_requests=2, backlog_tokens=3000)  # the prefill side is busy
    enc.claim(requests=2, image_tokens=1000)
    assert pre.run_step(lambda: "stepped") == "stepped"
    enc.release(False)
    split = enc.stats.last_split
    assert split is not None and split.encoder_tpcs + split.prefill_tpcs == TOTAL
    assert split.encoder_tpcs < split.prefill_tpcs  # less encoder work than prefill backlog
    e_mask, p_mask = masks_for(split, TOTAL)
    assert _calls(fake) == [(ENC, *to_words(e_mask, TOTAL)), (PRE, *to_words(p_mask, TOTAL))]

    pre.run_step(lambda: None)  # same split: nothing re-applied
    assert len(_calls(fake)) == 2
    assert enc.metrics()["encoder_tpcs"] == split.encoder_tpcs and pre.metrics()["sm_partition_applied"] == 1.0


def test_a_stealing_worker_does_not_follow_splits_and_counts_its_steps(tmp_path):
    path = channel_path("t", "encode-0", tmp_path)
    enc = EncoderGpuShare(ColocationChannel(path), StreamPartition("cpu", "encoder"))
    steal = LLMGpuShare(ColocationChannel(path), "combined", StreamPartition("cpu", "prefill"))
    assert steal.run_step(lambda: ["out"]) == ["out"]
    enc.claim(1, 10)
    assert steal.run_step(lambda: ["never"]) is None  # the encoder has the GPU
    enc.release(False)
    steal.report(held_requests=3, backlog_tokens=99)
    assert enc.channel.stolen_held() == 3 and enc.channel.prefill_backlog() == 0
    m = steal.metrics()
    assert (m["stolen_steps"], m["stolen_deferred_steps"]) == (1.0, 1.0)
    assert (m["stolen_decode_steps"], enc.metrics()["encode_gate_waited"]) == (1.0, 0.0)  # it stepped before we came


class _BrokenGate:
    """A channel whose stealer broke the protocol: a batch waited 0.2 s, through two stolen steps of 0.05 s.
    The real channel cannot be made to do this (that is its point), hence the stand-in."""

    def __init__(self, gate: GateWait) -> None:
        self.gate = gate

    def encoder_enter(self) -> GateWait:
        return self.gate


@pytest.mark.parametrize(("gate", "past", "longer"), [
    (GateWait(0.2, 2, 0.05), 1.0, 1.0),
    (GateWait(0.2, 1, 0.05), 0.0, 1.0),
    (GateWait(0.04, 1, 0.05), 0.0, 0.0),
    (GateWait(0.0, 0, 0.0), 0.0, 0.0),
])
def test_gate_waits_beyond_one_step_are_counted(gate, past, longer):
    enc = EncoderGpuShare(_BrokenGate(gate), StreamPartition("cpu", "encoder"))  # type: ignore[arg-type]
    enc.claim(1, 10)
    m = enc.metrics()
    assert (m["encode_gate_past_one_step"], m["encode_gate_longer_than_step"]) == (past, longer)
    assert m["encode_gate_waited"] == float(gate.steps > 0)
