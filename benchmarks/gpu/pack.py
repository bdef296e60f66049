"""The GPU measurement pack (benchmarks/gpu/run.sh runs it): one call on one CUDA GPU, under 8 minutes.

Steps, each under the run's budget (a step that would start past it is recorded as skipped), each
failure recorded without losing the others:
  a. exactness: the tiny LLaVA through encode -> transport -> prefill -> decode on the GPU, float32 exact,
     bfloat16 within the stated tolerance (exactness.py);
  b. C_E(B), B = 1..32, of a LLaVA-1.5-7B vision tower (CLIP ViT-L/14-336 + projector) and a Qwen2-VL-7B
     one, random weights, bf16 (curves.py) -> a `tierserve plan --profile` file for the H200;
  c. SM partitioning: benchmarks/gpu/smpartition.py in a child (encoder alone, beside a busy prefill
     stream unpartitioned, static and dynamic splits; green contexts, libsmctrl if it was built);
  d. prefill and decode times of a LLaVA-1.5-7B-sized language model, bf16, the reference engine's forwards;
  e. NVML readings every 0.5 s throughout (native/nvml.py).
Writes <out>/pack.json (everything, with the command), <out>/profile-<tier>-llava-1.5-7b.json and
<out>/summary.md. The profile feeds `tierserve plan --profile` and the planner suite's measured column
(`python -m benchmarks.planner_suite --profile <out>/profile-<tier>-llava-1.5-7b.json`).

    python -m benchmarks.gpu.pack --check-only   # everything up to the first CUDA call; no GPU: exit 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.gpu import curves, exactness
from benchmarks.gpu import pack_models as pm
from benchmarks.gpu.pack_report import summary_markdown
from native.nvml import GpuTelemetry

ROOT = Path(__file__).resolve().parents[2]
EXIT_NO_GPU = 2


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/gpu/run.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--check-only", action="store_true",
                   help="import and configure everything, stop before the first CUDA call (exit 2 without a GPU)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default: %(default)s)")
    p.add_argument("--tier", default="H200", help="catalog tier the profile is written for (default: %(default)s)")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="seconds for the whole pack; steps that would start later are skipped (default: %(default)s)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="encoder batch sizes B")
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[128, 512, 2048], help="prefill prompt tokens")
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8, 32], help="decode batch sizes")
    p.add_argument("--context", type=int, default=512, help="KV tokens per sequence in the decode steps")
    p.add_argument("--iters", type=int, default=5, help="timed repetitions per point (median)")
    p.add_argument("--text-layers", type=int, default=32, help="language-model layers (32 = 7B; fewer: a quick look)")
    p.add_argument("--smpartition-budget-s", type=float, default=120.0, help="seconds for step c")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu", help="output folder")
    a = p.parse_args(argv)
    if a.iters < 1 or a.budget_s <= 0 or min(a.batches + a.prompt_lengths + a.decode_batches) < 1:
        p.error("--iters, --budget-s, batch sizes and prompt lengths must be positive")
    return a


class NvmlSampler:
    """Step e: NVML readings of the device every `every_s` seconds in a thread, until stopped."""

    def __init__(self, device: str, every_s: float = 0.5) -> None:
        self.telemetry = GpuTelemetry(device, min_interval_s=0.0)
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append({"t_s": round(time.monotonic() - self.t0, 2), "step": self.step, **self.telemetry.read()})

    step = ""

    def __enter__(self) -> NvmlSampler:
        if self.telemetry.availability.ok:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def result(self) -> dict[str, Any]:
        return {"reason": self.telemetry.reason, "every_s": self.every_s, "samples": self.samples}


def check(a: argparse.Namespace) -> str | None:
    """Everything before the first CUDA call; the reason the pack cannot run, or None."""
    import torch
    import transformers

    pm.llava_config(a.text_layers)
    pm.qwen2vl_vision_config()
    from benchmarks.gpu import smpartition  # noqa: F401 (imports: step c runs it in a child)

    a.out.mkdir(parents=True, exist_ok=True)
    probe = a.out / ".writable"
    probe.write_text("")
    probe.unlink()
    print(f"checked: torch {torch.__version__}, transformers {transformers.__version__}, configs built, "
          f"{a.out} writable, NVML: {GpuTelemetry(f'cuda:{a.device}').reason}")
    if not torch.cuda.is_available():
        return (f"no CUDA GPU here (torch {torch.__version__}, CUDA build {torch.version.cuda}): the pack needs an "
                "NVIDIA GPU; everything before the first CUDA call passed")
    if a.device >= torch.cuda.device_count():
        return f"--device {a.device}: this host has {torch.cuda.device_count()} CUDA device(s)"
    return None


def _step(results: dict, name: str, deadline: float, sampler: NvmlSampler, fn) -> None:
    if time.monotonic() > deadline:
        results[name] = {"skipped": "the pack's budget ran out before this step"}
        return
    sampler.step = name
    t0 = time.monotonic()
    try:
        results[name] = fn()
    except Exception as e:  # one failed step must not lose the others' results
        results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    results[name + "_wall_s"] = round(time.monotonic() - t0, 1)
    print(f"{name}: done in {results[name + '_wall_s']} s", flush=True)


def _smpartition(a: argparse.Namespace) -> dict:
    out = a.out / "smpartition.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu.smpartition", "--device", str(a.device), "--out", str(out),
           "--budget-s", str(a.smpartition_budget_s)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.smpartition_budget_s + 90)
    res = json.loads(out.read_text()) if out.exists() else {}
    return {"command": " ".join(cmd), "exit_code": proc.returncode, "stderr_tail": proc.stderr[-2000:], "result": res}


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    started = time.monotonic()
    why = check(a)
    if why is not None:
        print(f"benchmarks/gpu: {why}", file=sys.stderr)
        return EXIT_NO_GPU
    import torch

    device = f"cuda:{a.device}"
    name = torch.cuda.get_device_name(a.device)
    if a.check_only:
        print(f"ready: {name} ({device}); run without --check-only to measure")
        return 0
    deadline = started + a.budget_s
    results: dict[str, Any] = {
        "command": " ".join(["benchmarks/gpu/run.sh", *(argv if argv is not None else sys.argv[1:])]),
        "gpu": name, "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "host": platform.node(),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    left = lambda: time.monotonic() > deadline  # noqa: E731
    with NvmlSampler(device) as sampler:
        _step(results, "exactness", deadline, sampler, lambda: exactness.run(device))
        for kind in ("llava-1.5-7b", "qwen2-vl-7b"):
            _step(results, f"encoder_{kind}", deadline, sampler,
                  lambda kind=kind: curves.encoder_curve(kind, device, a.batches, a.iters, left))
        _step(results, "smpartition", deadline - a.smpartition_budget_s / 2, sampler, lambda: _smpartition(a))
        _step(results, "llm", deadline, sampler, lambda: curves.llm_times(
            device, a.prompt_lengths, a.decode_batches, a.context, a.iters, left, a.text_layers))
    results["nvml"] = sampler.result()
    results["wall_s"] = round(time.monotonic() - started, 1)
    llava, llm = results.get("encoder_llava-1.5-7b"), results.get("llm")
    profile = curves.planner_profile(a.tier, results["measured_at"][:10], f"{results['command']} on {name}",
                                     llava if isinstance(llava, dict) and "points" in llava else None,
                                     llm if isinstance(llm, dict) and "prefill" in llm and a.text_layers == 32 else None)
    if "encode" in profile or "prefill" in profile:
        (a.out / f"profile-{a.tier}-llava-1.5-7b.json").write_text(json.dumps(profile, indent=2) + "\n")
    (a.out / "pack.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (a.out / "summary.md").write_text(summary_markdown(results))
    print(f"wrote {a.out}/pack.json, summary.md in {results['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
