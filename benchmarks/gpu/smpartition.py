"""SM partitioning on a real GPU: encoder batch latency next to a busy prefill, for none / static / dynamic.

On one CUDA GPU this builds the LLaVA vision encoder (default: the tiny one in coordinator/assets),
keeps a "prefill" busy on a second stream (a loop of large matmuls, a few in flight), and times the
encoder's batch on its own stream with CUDA events under three partitions:

- none: both streams may use every SM;
- static: SMPartition's static 50/50 split;
- dynamic: SMPartition's dynamic split, recomputed per micro-batch as the assumed prefill backlog
  cycles through --backlogs (with green contexts: one pre-created layout per distinct split).

Each backend found is used: libsmctrl stream masks (tried first in a child process, since an
unsupported CUDA version makes libsmctrl end the process) and CUDA green contexts. Before timing, a
confinement check runs a matmul on a quarter of the GPU and on all of it: if the partition works,
the quarter is clearly slower. Also timed side by side: the encoder alone, and the prefill alone, so
every result is a ratio from one run. The prefill here is a synthetic constant load, not an LLM
prefill, and its "backlog" only drives the policy; this checks the mechanism and the direction of
the trade-off (encoder latency vs prefill throughput), not EAServe's end-to-end numbers.

    python -m benchmarks.gpu.smpartition                # all backends -> benchmarks/results/gpu_smpartition.json
    python -m benchmarks.gpu.smpartition --check-only   # availability of each backend, then exit

Exit codes: 0 measured; 2 no CUDA GPU; 3 no partitioning backend; 4 the time budget ran out first.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig, TPCSplit
from native.green_context import GreenContexts
from native.smctrl import SMController
from native.tpc_mask import enable_mask, tpcs_to_sms

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "coordinator" / "assets" / "tiny-llava"
EXIT_NO_GPU, EXIT_NO_BACKEND, EXIT_BUDGET = 2, 3, 4


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="LLaVA checkpoint dir (default: the tiny one)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--backend", choices=("all", "libsmctrl", "green"), default="all")
    p.add_argument("--batch", type=int, default=64, help="images per encoder micro-batch")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--iters", type=int, default=30, help="timed micro-batches per mode")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prefill-dim", type=int, default=8192, help="side of the prefill's square matmuls")
    p.add_argument("--prefill-depth", type=int, default=2, help="prefill matmuls in flight at once")
    p.add_argument("--backlogs", type=int, nargs="+", default=[2048, 8192, 32768],
                   help="prefill backlog (tokens) the dynamic policy sees, cycled per micro-batch")
    p.add_argument("--encoder-token-cost", type=float, default=1.0, help="SMPartitionConfig.encoder_token_cost")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop measuring after this many seconds")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_smpartition.json")
    p.add_argument("--check-only", action="store_true", help="report each backend's availability and exit")
    p.add_argument("--selftest-libsmctrl", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0 or a.batch < 1 or a.prefill_depth < 1:
        p.error(f"need iters >= 1, warmup >= 0, batch >= 1, prefill-depth >= 1; got {a.iters}, {a.warmup}, "
                f"{a.batch}, {a.prefill_depth}")
    return a


@dataclass
class Deadline:
    """The run's time budget; every loop asks it before another round."""

    end: float

    def left(self) -> float:
        return self.end - time.monotonic()


class BusyPrefill(threading.Thread):
    """Keeps `depth` large matmuls in flight on `self.stream` (which the main thread may switch)."""

    def __init__(self, torch: Any, device: int, dim: int, dtype: Any, depth: int, stream: Any, deadline: Deadline,
                 max_launches: int = 2_000_000) -> None:
        super().__init__(daemon=True)
        self.torch, self.device, self.depth = torch, device, depth
        self.deadline, self.max_launches = deadline, max_launches
        self.a = torch.randn(dim, dim, device=f"cuda:{device}", dtype=dtype)
        self.b = torch.randn(dim, dim, device=f"cuda:{device}", dtype=dtype)
        self.c = torch.empty(dim, dim, device=f"cuda:{device}", dtype=dtype)
        self.stream = stream
        self.done_at: list[float] = []
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        torch = self.torch
        torch.cuda.set_device(self.device)
        pending: list[Any] = []
        try:
            for _ in range(self.max_launches):
                if self.stop.is_set() or self.deadline.left() <= 0:
                    break
                with torch.cuda.stream(self.stream):
                    torch.matmul(self.a, self.b, out=self.c)
                    ev = torch.cuda.Event()
                    ev.record()
                pending.append(ev)
                if len(pending) >= self.depth:
                    pending.pop(0).synchronize()
                    self.done_at.append(time.perf_counter())
            for ev in pending:
                ev.synchronize()
        except Exception as e:  # noqa: BLE001 - reported in the results, never silently
            self.error = f"{type(e).__name__}: {e}"

    def rate(self, t0: float, t1: float) -> float:
        """Matmuls completed per second between t0 and t1 (perf_counter)."""
        n = sum(1 for t in self.done_at if t0 <= t <= t1)
        return n / (t1 - t0) if t1 > t0 else 0.0


def _stats(ms: list[float]) -> dict[str, float | int]:
    xs = sorted(ms)
    return {"n": len(xs), "mean": statistics.fmean(xs), "p50": xs[len(xs) // 2],
            "p99": xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]}


def _time_on(torch: Any, stream: Any, fn: Callable[[], Any]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        fn()
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _load_encoder(torch: Any, a: argparse.Namespace) -> tuple[Callable[[], Any], int]:
    """The vision tower + projector on the GPU and a closure encoding one random batch; image tokens per batch."""
    from transformers import LlavaForConditionalGeneration

    dtype = getattr(torch, a.dtype)
    model = LlavaForConditionalGeneration.from_pretrained(a.model, dtype=dtype)
    model.model.language_model = None
    model.lm_head = None
    vision = model.model.eval().to(f"cuda:{a.device}")
    size = model.config.vision_config.image_size
    pixels = torch.randn(a.batch, 3, size, size, device=f"cuda:{a.device}", dtype=dtype)

    @torch.inference_mode()
    def encode() -> Any:
        return vision.get_image_features(pixel_values=pixels)

    out = encode()
    torch.cuda.synchronize(a.device)
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    if isinstance(feats, (list, tuple)):
        tokens = sum(int(f.shape[0]) for f in feats)
    else:
        tokens = int(feats.shape[0] * feats.shape[1])
    return encode, tokens


@dataclass
class Mode:
    """How one partition mode prepares micro-batch i: (encoder stream, prefill stream, split used)."""

    name: str
    prefill_stream: Any
    """Where the prefill starts; before_batch may move it (green layouts), masks never do."""
    before_batch: Callable[[int], tuple[Any, Any, TPCSplit | None]]
    cleanup: Callable[[], None] = lambda: None


def _measure(torch: Any, a: argparse.Namespace, encode: Callable[[], Any], mode: Mode, prefill: BusyPrefill | None,
             deadline: Deadline) -> dict[str, Any]:
    lat, apply_us, splits = [], [], []
    t_first = t_last = 0.0
    for i in range(a.warmup + a.iters):
        if deadline.left() <= 0:
            break
        t0 = time.perf_counter()
        stream, prefill_stream, split = mode.before_batch(i)
        if prefill is not None:
            prefill.stream = prefill_stream  # in-flight matmuls finish where they were launched
        apply_us.append((time.perf_counter() - t0) * 1e6)
        ms = _time_on(torch, stream, encode)
        if i == a.warmup:
            t_first = t0
        if i >= a.warmup:
            lat.append(ms)
            t_last = time.perf_counter()
            if split is not None:
                splits.append([split.encoder_tpcs, split.prefill_tpcs])
    mode.cleanup()
    if not lat:
        return {"error": "time budget ran out before any timed micro-batch"}
    out: dict[str, Any] = {"encoder_ms": _stats(lat), "prepare_us": _stats(apply_us[a.warmup:] or apply_us)}
    if splits:
        out["splits_encoder_prefill_tpcs"] = sorted({tuple(s) for s in splits})
    if prefill is not None:
        out["prefill_matmul_per_s"] = prefill.rate(t_first, t_last)
    return out


def _run_modes(torch: Any, a: argparse.Namespace, encode: Callable[[], Any], modes: list[Mode],
               deadline: Deadline) -> dict[str, Any]:
    """Encoder alone, prefill alone, then each mode with the prefill busy beside the encoder."""
    dtype = getattr(torch, a.dtype)
    results: dict[str, Any] = {}
    plain, plain_prefill = torch.cuda.Stream(a.device), torch.cuda.Stream(a.device)
    alone = Mode("alone", plain_prefill, lambda i: (plain, plain_prefill, None))
    results["encoder_alone"] = _measure(torch, a, encode, alone, None, deadline)
    solo = BusyPrefill(torch, a.device, a.prefill_dim, dtype, a.prefill_depth, plain_prefill, deadline)
    solo.start()
    t0 = time.perf_counter()
    time.sleep(min(2.0, max(0.0, deadline.left())))
    solo.stop.set()
    solo.join(timeout=60)
    results["prefill_alone_matmul_per_s"] = solo.rate(t0, time.perf_counter())
    for mode in modes:
        if deadline.left() <= 0:
            break
        prefill = BusyPrefill(torch, a.device, a.prefill_dim, dtype, a.prefill_depth, mode.prefill_stream, deadline)
        prefill.start()
        time.sleep(0.2)
        results[mode.name] = _measure(torch, a, encode, mode, prefill, deadline)
        prefill.stop.set()
        prefill.join(timeout=60)
        if prefill.error:
            results[mode.name]["prefill_error"] = prefill.error
    return results


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    def p50(m: str) -> float | None:
        return res.get(m, {}).get("encoder_ms", {}).get("p50")

    def rate(m: str) -> float | None:
        return res.get(m, {}).get("prefill_matmul_per_s")

    out = {}
    for num, den in (("static", "none"), ("dynamic", "none"), ("dynamic", "static"), ("none", "encoder_alone")):
        if p50(num) and p50(den):
            out[f"encoder_p50_{num}_over_{den}"] = p50(num) / p50(den)
        if rate(num) and rate(den):
            out[f"prefill_rate_{num}_over_{den}"] = rate(num) / rate(den)
    alone = res.get("prefill_alone_matmul_per_s")
    for m in ("none", "static", "dynamic"):
        if rate(m) and alone:
            out[f"prefill_rate_{m}_over_alone"] = rate(m) / alone
    return out


def _policies(total_tpcs: int, a: argparse.Namespace, tokens: int) -> dict[str, Callable[[int], TPCSplit]]:
    static = SMPartition(total_tpcs, SMPartitionConfig(mode="static"))
    dynamic = SMPartition(total_tpcs, SMPartitionConfig(mode="dynamic", encoder_token_cost=a.encoder_token_cost))
    return {
        "none": lambda i: TPCSplit(total_tpcs, total_tpcs, "none"),
        "static": lambda i: static.split(a.batch, tokens, a.backlogs[i % len(a.backlogs)]),
        "dynamic": lambda i: dynamic.split(a.batch, tokens, a.backlogs[i % len(a.backlogs)]),
    }


def _confinement(torch: Any, a: argparse.Namespace, full: Any, quarter: Any, prepare: Callable[[], None]) -> dict:
    """A matmul loop on a quarter of the GPU vs all of it: the quarter should be clearly slower."""
    dtype = getattr(torch, a.dtype)
    x = torch.randn(a.prefill_dim, a.prefill_dim, device=f"cuda:{a.device}", dtype=dtype)

    def work() -> None:
        for _ in range(5):
            x @ x

    prepare()
    for stream in (full, quarter):  # warm-up: cuBLAS handles, workspaces
        _time_on(torch, stream, work)
    t_full = min(_time_on(torch, full, work) for _ in range(3))
    t_quarter = min(_time_on(torch, quarter, work) for _ in range(3))
    slowdown = t_quarter / t_full
    return {"full_ms": t_full, "quarter_ms": t_quarter, "slowdown": slowdown, "confined": slowdown >= 1.5}


def _libsmctrl_backend(torch: Any, a: argparse.Namespace, encode: Callable[[], Any], tokens: int,
                       deadline: Deadline) -> dict[str, Any]:
    ctl = SMController()
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    total = ctl.num_tpcs(a.device)
    enc, pre = torch.cuda.Stream(a.device), torch.cuda.Stream(a.device)
    full = torch.cuda.Stream(a.device)
    quarter_mask = enable_mask(range(max(1, total // 4)), total)
    confinement = _confinement(torch, a, full, enc, lambda: ctl.apply(enc.cuda_stream, quarter_mask, total))
    ctl.apply(enc.cuda_stream, 0, total)
    policies = _policies(total, a, tokens)

    def mode(name: str) -> Mode:
        def before(i: int) -> tuple[Any, Any, TPCSplit]:
            split = policies[name](i)
            ctl.apply_split(split, total, enc.cuda_stream, pre.cuda_stream)
            return enc, pre, split

        def clear() -> None:
            ctl.apply(enc.cuda_stream, 0, total)
            ctl.apply(pre.cuda_stream, 0, total)

        return Mode(name, pre, before, clear)

    res = _run_modes(torch, a, encode, [mode(m) for m in ("none", "static", "dynamic")], deadline)
    return {"availability": ctl.available().reason, "total_tpcs": total, "gpu_sms": sms,
            "confinement_quarter_vs_full": confinement, "results": res, "ratios": _ratios(res)}


def _green_backend(torch: Any, a: argparse.Namespace, encode: Callable[[], Any], tokens: int,
                   deadline: Deadline) -> dict[str, Any]:
    gc = GreenContexts(a.device)
    dev = torch.device("cuda", a.device)
    try:
        sms = gc.device_sms()
        total = sms // 2
        plain_enc, plain_pre = torch.cuda.Stream(a.device), torch.cuda.Stream(a.device)
        quarter, _ = gc.split(max(1, sms // 4))
        confinement = _confinement(torch, a, plain_enc, torch.cuda.ExternalStream(quarter.stream, device=dev),
                                   lambda: None)
        policies = _policies(total, a, tokens)
        layouts: dict[int, tuple[Any, Any, int | None, int | None]] = {}

        def layout(split: TPCSplit) -> tuple[Any, Any]:
            if split.mode == "none" or split.encoder_tpcs == 0 or split.prefill_tpcs == 0:
                return plain_enc, plain_pre  # a side with nothing to do: no partition to make
            if split.encoder_tpcs not in layouts:
                e, p = gc.split(tpcs_to_sms(split.encoder_tpcs))
                layouts[split.encoder_tpcs] = (torch.cuda.ExternalStream(e.stream, device=dev),
                                               torch.cuda.ExternalStream(p.stream, device=dev), e.sms, p.sms)
            return layouts[split.encoder_tpcs][:2]

        for name in ("static", "dynamic"):  # pre-create every layout before timing
            for i in range(len(a.backlogs)):
                layout(policies[name](i))

        def mode(name: str) -> Mode:
            def before(i: int) -> tuple[Any, Any, TPCSplit]:
                split = policies[name](i)
                return (*layout(split), split)

            return Mode(name, layout(policies[name](0))[1], before)

        res = _run_modes(torch, a, encode, [mode(m) for m in ("none", "static", "dynamic")], deadline)
        granted = {str(k): {"encoder_sms": v[2], "prefill_sms": v[3]} for k, v in sorted(layouts.items())}
        return {"availability": gc.available().reason, "gpu_sms": sms, "policy_total_tpcs": total,
                "quarter_partition_sms": quarter.sms, "layouts_by_encoder_tpcs": granted,
                "confinement_quarter_vs_full": confinement, "results": res, "ratios": _ratios(res)}
    finally:
        torch.cuda.synchronize(a.device)
        gc.close()


def _selftest_libsmctrl(a: argparse.Namespace) -> int:
    """In a child process: one masked launch and back, so a libsmctrl that ends the process ends only this."""
    import torch

    ctl = SMController()
    total = ctl.num_tpcs(a.device)
    s = torch.cuda.Stream(a.device)
    x = torch.randn(1024, 1024, device=f"cuda:{a.device}")
    ctl.apply(s.cuda_stream, enable_mask(range(max(1, total // 2)), total), total)
    with torch.cuda.stream(s):
        (x @ x).sum().item()
    ctl.apply(s.cuda_stream, 0, total)
    print(f"libsmctrl selftest ok: {total} TPCs")
    return 0


def _libsmctrl_usable(a: argparse.Namespace) -> tuple[bool, str]:
    state = SMController().available()
    if not state.ok:
        return False, state.reason
    cmd = [sys.executable, "-m", "benchmarks.gpu.smpartition", "--selftest-libsmctrl", "--device", str(a.device)]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        return False, "libsmctrl selftest (child process) took over 180 s"
    if done.returncode != 0:
        return False, f"libsmctrl selftest failed (rc={done.returncode}): {(done.stderr or done.stdout)[-600:].strip()}"
    return True, f"{state.reason}; {done.stdout.strip()}"


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.selftest_libsmctrl:
        return _selftest_libsmctrl(a)
    try:
        import torch
    except ImportError as e:
        print(f"no torch: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    if not torch.cuda.is_available() or a.device >= torch.cuda.device_count():
        print(f"no CUDA GPU {a.device} (torch {torch.__version__}, CUDA {torch.version.cuda}): "
              "this check needs an NVIDIA GPU", file=sys.stderr)
        return EXIT_NO_GPU
    deadline = Deadline(time.monotonic() + a.budget_s)
    backends: dict[str, tuple[bool, str]] = {}
    if a.backend in ("all", "libsmctrl"):
        backends["libsmctrl"] = _libsmctrl_usable(a)
    if a.backend in ("all", "green"):
        state = GreenContexts(a.device).available()
        backends["green"] = (state.ok, state.reason)
    for name, (ok, reason) in backends.items():
        print(f"{name:10s} {'ok' if ok else 'NO'}: {reason}")
    usable = [n for n, (ok, _) in backends.items() if ok]
    if a.check_only or not usable:
        if not usable:
            print("no SM-partitioning backend is usable here (see the reasons above)", file=sys.stderr)
        return 0 if usable else EXIT_NO_BACKEND
    torch.cuda.set_device(a.device)
    encode, tokens = _load_encoder(torch, a)
    props = torch.cuda.get_device_properties(a.device)
    report: dict[str, Any] = {
        "command": "python -m benchmarks.gpu.smpartition " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "encoder batch latency (CUDA events) next to a busy matmul 'prefill', per SM-partition mode",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"gpu": props.name, "sms": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                    "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "model": str(a.model), "batch": a.batch, "image_tokens_per_batch": tokens, "dtype": a.dtype,
        "prefill": {"matmul_dim": a.prefill_dim, "in_flight": a.prefill_depth, "backlogs_tokens": a.backlogs},
        "backends": {n: {"usable": ok, "reason": r} for n, (ok, r) in backends.items()},
    }
    runners = {"libsmctrl": _libsmctrl_backend, "green": _green_backend}
    for name in usable:
        if deadline.left() <= 0:
            report["backends"][name]["skipped"] = "time budget ran out"
            continue
        try:
            report["backends"][name].update(runners[name](torch, a, encode, tokens, deadline))
        except Exception as e:  # noqa: BLE001 - one backend failing must not hide the other's results
            report["backends"][name]["error"] = f"{type(e).__name__}: {e}"
    report["budget_exhausted"] = deadline.left() <= 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2, default=list))
    for name in usable:
        b = report["backends"][name]
        print(f"\n{name}: {b.get('error') or ''}")
        if "confinement_quarter_vs_full" in b:
            c = b["confinement_quarter_vs_full"]
            verdict = "confined" if c["confined"] else "NOT confined"
            print(f"  quarter-GPU matmul slowdown {c['slowdown']:.2f}x ({verdict})")
        for m in ("encoder_alone", "none", "static", "dynamic"):
            r = b.get("results", {}).get(m, {})
            if "encoder_ms" in r:
                e = r["encoder_ms"]
                extra = f"  prefill {r['prefill_matmul_per_s']:.1f} matmul/s" if "prefill_matmul_per_s" in r else ""
                print(f"  {m:14s} encoder p50 {e['p50']:.3f} ms  p99 {e['p99']:.3f} ms{extra}")
        for k, v in b.get("ratios", {}).items():
            print(f"  {k:40s} {v:.3f}")
    print(f"\nwrote {a.out}")
    measured = any("results" in report["backends"][n] for n in usable)
    return 0 if measured else EXIT_BUDGET


if __name__ == "__main__":
    sys.exit(main())
