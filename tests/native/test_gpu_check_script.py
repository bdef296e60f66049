"""benchmarks/gpu/smpartition.py on a CPU: it refuses clearly, and its pure helpers compute what they claim."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.gpu import smpartition


def test_no_gpu_exits_2_with_a_reason(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the no-GPU exit cannot be observed")
    assert smpartition.main(["--check-only"]) == smpartition.EXIT_NO_GPU
    assert smpartition.main([]) == smpartition.EXIT_NO_GPU
    assert "this check needs an NVIDIA GPU" in capsys.readouterr().err


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        smpartition.main(["--iters", "0"])


def test_policies_cycle_backlogs_per_micro_batch():
    a = argparse.Namespace(batch=8, backlogs=[10, 10**6], encoder_token_cost=1.0)
    pol = smpartition._policies(66, a, tokens=8 * 196)
    assert pol["none"](0).mode == "none"
    assert pol["static"](0) == pol["static"](1)
    small, large = pol["dynamic"](0), pol["dynamic"](1)
    assert small.encoder_tpcs > large.encoder_tpcs  # more prefill backlog, fewer TPCs for the encoder
    assert small.encoder_tpcs + small.prefill_tpcs == 66 == large.encoder_tpcs + large.prefill_tpcs


def test_ratios_are_side_by_side():
    res = {"encoder_alone": {"encoder_ms": {"p50": 1.0}}, "prefill_alone_matmul_per_s": 100.0,
           "none": {"encoder_ms": {"p50": 4.0}, "prefill_matmul_per_s": 90.0},
           "static": {"encoder_ms": {"p50": 2.0}, "prefill_matmul_per_s": 50.0},
           "dynamic": {"encoder_ms": {"p50": 1.5}, "prefill_matmul_per_s": 60.0}}
    r = smpartition._ratios(res)
    assert r["encoder_p50_none_over_encoder_alone"] == 4.0
    assert r["encoder_p50_dynamic_over_static"] == 0.75
    assert r["prefill_rate_dynamic_over_static"] == 1.2
    assert r["prefill_rate_none_over_alone"] == 0.9
