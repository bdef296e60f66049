"""benchmarks/gpu/run.sh on a CPU: it runs everything up to the first CUDA call and says why it stops; what
it writes for the planner is a valid Profile; its summary renders missing steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import pack
from benchmarks.gpu.curves import planner_profile
from benchmarks.gpu.pack_report import summary_markdown
from coordinator.planner.profile import Profile

ROOT = Path(__file__).resolve().parents[2]


def test_check_only_stops_before_cuda_with_a_reason(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the no-GPU exit cannot be observed")
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--check-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == pack.EXIT_NO_GPU, proc.stderr
    assert "configs built" in proc.stdout and "NVML: unsupported: " in proc.stdout
    assert "no CUDA GPU here" in proc.stderr and "everything before the first CUDA call passed" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        pack.main(["--iters", "0"])
    assert e.value.code == 2 and "must be positive" in capsys.readouterr().err


def test_what_the_planner_reads_is_a_valid_profile():
    curve = {"tokens_per_item": 576, "points": [{"batch": 1, "seconds": 0.004, "items_per_s": 250.0},
                                                {"batch": 8, "seconds": 0.012, "items_per_s": 666.7}]}
    llm = {"prefill": [{"tokens": 512, "seconds": 0.03, "tokens_per_s": 17066.0}],
           "decode": [{"batch": 8, "context_tokens": 4096, "seconds": 0.02, "tokens_per_s": 400.0}]}
    prof = Profile.model_validate(planner_profile("H200", "2026-12-01", "run.sh", curve, llm))
    assert prof.encode_s("image", 8, 576) == pytest.approx(0.012)
    assert prof.prefill_s(512) == pytest.approx(0.03) and prof.decode_step_s(8, 4096) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="no measured points"):  # nothing measured: no profile, never an empty one
        Profile.model_validate(planner_profile("H200", "2026-12-01", "run.sh", None, None))


def test_summary_names_what_was_not_measured():
    md = summary_markdown({"gpu": "NVIDIA H200", "device": "cuda:0", "exactness": {"error": "RuntimeError: boom"},
                           "encoder_llava-1.5-7b": {"skipped": "the pack's budget ran out before this step"},
                           "nvml": {"reason": "nvml: NVIDIA H200", "samples": [{"gpu_util_pct": 50.0}]}})
    assert "not measured: RuntimeError: boom" in md and "budget ran out" in md and "gpu_util_pct: max 50" in md
