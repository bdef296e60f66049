"""The per-micro-batch SM split as the live workers apply it: encoder side -> shared channel -> prefill side.

The real libsmctrl needs an NVIDIA GPU; a stand-in library records the masks (see test_smctrl_wrapper.py),
behind the real shim, which refuses stream 0 as it does on a GPU. torch's stream calls come from
native_fakes.FakeCuda, whose current stream is the legacy default stream (handle 0), as a GPU thread's is.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from pathlib import Path

import pytest
from native_fakes import FakeCuda

from coordinator.policies.sm_partition import SMPartitionConfig, TPCSplit
from coordinator.protocol.colocation import ColocationChannel, GateWait, channel_path
from encode_node.gpu_share import EncoderGpuShare
from llm_node.gpu_share import LLMGpuShare
from native.green_context import GreenContexts
from native.smctrl import SMControlError, SMController
from native.stream_partition import StreamPartition
from native.tpc_mask import masks_for, to_words

TOTAL = 66  # the fake's TPC count (> 64: the 128-bit call)


def _calls(fake: Path) -> list[tuple[int, int, int]]:
    lib = ctypes.CDLL(str(fake))
    n = ctypes.c_int.in_dll(lib, "fake_ncalls").value
    streams = (ctypes.c_void_p * 16).in_dll(lib, "fake_streams")
    los, his = (ctypes.c_uint64 * 16).in_dll(lib, "fake_los"), (ctypes.c_uint64 * 16).in_dll(lib, "fake_his")
    return [(streams[i], los[i], his[i]) for i in range(min(n, 16))]


def _partition(fake: Path, shim_cache: Path, side: str, cuda: FakeCuda) -> StreamPartition:
    ctl = SMController(fake, cache_dir=shim_cache, check_driver=False)
    return StreamPartition("cuda:0", side, ctl, cuda=cuda)  # type: ignore[arg-type]


def test_a_cpu_device_runs_unpartitioned_and_says_why():
    part = StreamPartition("cpu", "encoder")
    assert not part.supported and "needs a CUDA GPU" in part.reason and part.total_tpcs is None
    assert part.apply(TPCSplit(1, 1, "static")) is False


def test_each_batch_split_reaches_both_streams(tmp_path, shim_cache, fake_libsmctrl):
    fake = fake_libsmctrl(ext=True)
    ctypes.CDLL(str(fake)).fake_reset()
    path = channel_path("t", "encode-0", tmp_path)
    cuda = FakeCuda()
    enc = EncoderGpuShare(ColocationChannel(path), _partition(fake, shim_cache, "encoder", cuda))
    enc.config = SMPartitionConfig(mode="dynamic", min_share=0.25)
    pre = LLMGpuShare(ColocationChannel(path), "prefill", _partition(fake, shim_cache, "prefill", cuda))
    ENC, PRE = enc.partition.stream.cuda_stream, pre.partition.stream.cuda_stream  # noqa: N806

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


def test_no_batch_masks_stream_0(tmp_path, shim_cache, fake_libsmctrl):
    """Regression: the partition masked torch.cuda.current_stream(), which on a GPU is the legacy default
    stream (handle 0); the shim refuses it, so every batch failed. Each side now masks a stream it created,
    and its work runs on that stream in the thread that masked it."""
    fake = fake_libsmctrl(ext=True)
    ctypes.CDLL(str(fake)).fake_reset()
    ctl = SMController(fake, cache_dir=shim_cache, check_driver=False)
    cuda = FakeCuda()
    default = cuda.current_stream("cuda:0").cuda_stream
    assert default == 0
    with pytest.raises(SMControlError, match="stream is NULL"):  # what masking the current stream did
        ctl.apply(default, 1, TOTAL)
    assert _calls(fake) == []

    path = channel_path("t", "encode-0", tmp_path)
    enc = EncoderGpuShare(ColocationChannel(path), StreamPartition("cuda:0", "encoder", ctl, cuda=cuda))
    enc.config = SMPartitionConfig(mode="dynamic", min_share=0.25)
    pre = LLMGpuShare(ColocationChannel(path), "prefill", StreamPartition("cuda:0", "prefill", ctl, cuda=cuda))
    seen: dict[str, tuple[int, int]] = {}

    def forward(side: str):
        seen[side] = (threading.get_ident(), cuda.current_stream("cuda:0").cuda_stream)
        return [side]

    async def encoder_batch():  # as the encode worker runs it: claim + forward in one worker thread
        return await asyncio.to_thread(enc.run_batch, 2, 500, lambda: (threading.get_ident(), forward("encoder")))

    for backlog in (100, 5000):  # two batches, two different splits
        pre.report(held_requests=1, backlog_tokens=backlog)
        _, (thread, out) = asyncio.run(encoder_batch())
        enc.release(False)
        assert out == ["encoder"] and seen["encoder"] == (thread, enc.partition.stream.cuda_stream)
        assert pre.run_step(lambda: forward("prefill")) == ["prefill"]
        assert seen["prefill"][1] == pre.partition.stream.cuda_stream

    calls = _calls(fake)
    assert len(calls) == 4 and all(stream != 0 for stream, _, _ in calls), calls
    assert {s for s, _, _ in calls} == {enc.partition.stream.cuda_stream, pre.partition.stream.cuda_stream}
    assert len({(lo, hi) for s, lo, hi in calls if s == enc.partition.stream.cuda_stream}) == 2  # re-masked per batch
    assert cuda.current_stream("cuda:0").cuda_stream == 0  # the caller's stream is current again afterwards
    assert enc.partition.stream.waited_on == [0, 0]  # each batch waited for the caller's stream before it ran


def test_green_contexts_pick_a_pre_created_stream_per_batch(fake_libcuda):
    """Without libsmctrl, green contexts: layouts made up front, the stream nearest each batch's split."""
    ctypes.CDLL(str(fake_libcuda)).fake_reset()
    ctl = SMController("/nonexistent/libsmctrl.so", check_driver=False)
    cuda = FakeCuda()
    part = StreamPartition("cuda:0", "encoder", ctl, cuda=cuda, green=GreenContexts(driver_path=str(fake_libcuda)))
    assert part.supported and part.backend == "green" and part.total_tpcs == 66, part.reason
    streams = set()
    for e in (16, 33, 50):
        assert part.apply(TPCSplit(e, 66 - e, "dynamic"))
        assert part.stream.cuda_stream != 0
        streams.add(part.stream.cuda_stream)
        with part.running():
            assert cuda.current_stream("cuda:0") is part.stream
    assert len(streams) == 3  # a quarter, a half, three quarters of the SMs
    part.apply(TPCSplit(0, 0, "none"))
    assert part.stream.cuda_stream not in streams  # the whole GPU: a plain created stream


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
