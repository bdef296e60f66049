"""Work stealing on and off, side by side on one local CPU cluster (HeteroServe's cross-type stealing).

One encode worker with a co-located stealing (combined) worker, and one remote combined worker. Two
workloads, each replayed as the same seeded open-loop Poisson trace with stealing off, then on:

- language-heavy: image requests with long outputs (ignore_eos, fixed length); the encoder is mostly
  idle and the remote worker is the bottleneck. Reported: throughput (requests and output tokens per
  second of the run) on vs off.
- mixed: more images, shorter outputs, so micro-batches arrive while stolen requests decode. Reported:
  each request's encode latency (taken from its stream until its encoder pass ends, so it includes any
  wait for a stolen step) on vs off, against this cell's mean stolen decode step: the issue's bound is
  that stealing adds at most one decode step of stolen work to an encode batch. The encode worker also
  checks the bound per micro-batch at the GPU gate (coordinator/protocol/colocation.py GateWait): how
  many batches found a stolen step in their way, and how many waited through more than one step or
  longer than the step they waited on (both must be 0). Every figure is this cell's alone (counters
  differenced around it).

    python -m benchmarks.work_stealing --requests 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.control_point import run_trace
from benchmarks.stats import percentile
from coordinator.demo import data_url, demo_image
from coordinator.launcher import ClusterSpec, LocalCluster
from coordinator.redis_server import free_port

WORKLOADS = {
    "language_heavy": {"rate": 4.0, "max_tokens": 96},
    "mixed": {"rate": 3.0, "max_tokens": 24},
}
BENCH_MODEL = {"text_hidden": 512, "text_layers": 8}
"""The default model: tiny-llava's vision tower with a 512-wide, 8-layer language model (80 MB), so a decode
step costs compute that grows with the batch (14 ms at 1, 24 ms at 4, 54 ms at 16 on one core), as on a GPU.
The 4 MB tiny-llava's steps are Python overhead that costs the same at any batch: no LLM worker saturates."""


def bench_model(path: Path | None) -> Path:
    if path is not None:
        return path
    out = Path.home() / ".cache" / "tierserve" / "models" / "llava-h{text_hidden}-l{text_layers}".format(**BENCH_MODEL)
    if not (out / "config.json").is_file():
        from llm_node.tiny_model import generate

        generate(out, **BENCH_MODEL)
    return out


def _offsets(marks_stages: dict[str, float]) -> dict[str, float]:
    """Absolute offsets of each mark from the first, rebuilt from the response's consecutive stages."""
    out, t = {}, 0.0
    for hop, seconds in marks_stages.items():
        a, b = hop.split("->")
        out.setdefault(a, t)
        t += seconds
        out[b] = t
    return out


async def _one(client: httpx.AsyncClient, i: int, max_tokens: int) -> dict:
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(demo_image(i % 6))}},
                                                      {"type": "text", "text": "Describe this image."}]}]}
    t0 = time.perf_counter()
    r = await client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        return {"ok": False, "error": r.text[:200]}
    ts = r.json()["tierserve"]
    at = _offsets(ts["stages_s"])
    return {"ok": True, "e2e": time.perf_counter() - t0, "worker": ts["prefill_worker"],
            "tokens": r.json()["usage"]["completion_tokens"],
            "encode_latency": at["encode_end"] - at["encode_dequeued"],
            "gate_wait": at["encode_start"] - at["encode_dequeued"]}


def _stats(url: str) -> dict[str, dict]:
    return {w["worker_id"]: w["stats"] for w in httpx.get(f"{url}/v1/cluster", timeout=10).json()["workers"]}


COUNTERS = ("stolen_seconds", "stolen_steps", "stolen_decode_seconds", "stolen_decode_steps",
            "stolen_preempted_prefills", "encode_gate_batches", "encode_gate_waited", "encode_gate_past_one_step",
            "encode_gate_longer_than_step")
"""Cumulative worker counters (llm-steal-0's stolen_*, encode-0's encode_gate_*), differenced per cell."""


def _counters(url: str) -> dict[str, float]:
    stats = _stats(url)
    return {k: v for w in ("llm-steal-0", "encode-0") for k, v in stats.get(w, {}).items() if k in COUNTERS}


def summarize(rows: list[dict], wall_s: float, steal_stats: dict) -> dict:
    ok = [r for r in rows if r["ok"]]
    enc = [r["encode_latency"] for r in ok]
    ms = lambda v: None if v is None else round(v * 1e3, 2)  # noqa: E731
    return {"requests": len(rows), "failed": len(rows) - len(ok), "wall_s": round(wall_s, 3),
            "throughput_rps": round(len(ok) / wall_s, 4),
            "output_tokens_per_s": round(sum(r["tokens"] for r in ok) / wall_s, 2),
            "stolen_requests": sum(r["worker"] == "llm-steal-0" for r in ok),
            "encode_latency_ms": {"p50": ms(percentile(enc, 0.5)), "p99": ms(percentile(enc, 0.99)), "max": ms(max(enc, default=None))},
            "dequeue_to_encode_start_ms": {"max": ms(max((r["gate_wait"] for r in ok), default=None))},
            "gate": {"batches": steal_stats.get("encode_gate_batches"), "waited": steal_stats.get("encode_gate_waited"),
                     "past_one_step": steal_stats.get("encode_gate_past_one_step"),
                     "longer_than_step": steal_stats.get("encode_gate_longer_than_step")},
            "stolen_step_ms": {"mean": ms(steal_stats["stolen_seconds"] / steal_stats["stolen_steps"])
                               if steal_stats.get("stolen_steps") else None,
                               "mean_decode_only": ms(steal_stats["stolen_decode_seconds"] / steal_stats["stolen_decode_steps"])
                               if steal_stats.get("stolen_decode_steps") else None},
            "preempted_prefills": steal_stats.get("stolen_preempted_prefills")}


def _set_stealing(url: str, enabled: bool, threshold: int, max_stolen: int) -> None:
    r = httpx.put(f"{url}/v1/admin/policy", timeout=10, json={"stealing": {
        "enabled": enabled, "remote_load_threshold": threshold, "max_stolen": max_stolen}})
    r.raise_for_status()
    time.sleep(1.2)  # encode workers re-read the policy at most once a second


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.work_stealing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40, help="requests per (workload, on/off) cell")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--threshold", type=int, default=1, help="steal when the remote worker holds >= this many")
    p.add_argument("--max-stolen", type=int, default=4, help="most stolen requests in flight")
    p.add_argument("--max-num-seqs", type=int, default=8, help="sequences per LLM engine step (a KV-memory bound)")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint dir (default: a 512x8 language model generated into ~/.cache/tierserve/models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/work_stealing.json"))
    a = p.parse_args(argv)
    if a.requests < 1:
        p.error("--requests must be >= 1")
    console = Console()
    results: dict[str, dict] = {}
    model = bench_model(a.model)
    spec = ClusterSpec(port=free_port(), model_dir=model, model_name="bench", steal=True, pin_cores=True,
                       llm_args=["--max-num-seqs", str(a.max_num_seqs)])
    with LocalCluster(spec) as cluster, Progress(console=console) as progress:
        asyncio.run(run_trace(cluster.url, [0.2] * 4, 4, progress, "warm-up", one=_one, timeout_s=300))
        for name in a.workloads:
            w = WORKLOADS[name]
            rng = random.Random(a.seed)
            gaps = [rng.expovariate(w["rate"]) for _ in range(a.requests)]
            for enabled in (False, True):
                _set_stealing(cluster.url, enabled, a.threshold, a.max_stolen)
                before = _counters(cluster.url)
                rows, wall = asyncio.run(run_trace(cluster.url, gaps, w["max_tokens"], progress,
                                                   f"{name} stealing {'on' if enabled else 'off'}", one=_one, timeout_s=300))
                time.sleep(2.5)  # the next heartbeat carries the workers' counters
                after = _counters(cluster.url)
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}  # this cell's alone
                results.setdefault(name, {"workload": w})["on" if enabled else "off"] = summarize(rows, wall, delta)
        _set_stealing(cluster.url, False, a.threshold, a.max_stolen)
    for name, r in results.items():
        off, on = r["off"], r["on"]
        r["throughput_ratio_on_vs_off"] = round(on["throughput_rps"] / off["throughput_rps"], 3)
        r["tokens_per_s_ratio_on_vs_off"] = round(on["output_tokens_per_s"] / off["output_tokens_per_s"], 3)
        r["encode_p50_rise_ms"] = round(on["encode_latency_ms"]["p50"] - off["encode_latency_ms"]["p50"], 2)
        r["encode_p99_rise_ms"] = round(on["encode_latency_ms"]["p99"] - off["encode_latency_ms"]["p99"], 2)
        step = on["stolen_step_ms"]["mean_decode_only"]
        if step is not None:  # the issue's unit: one decode step of stolen work, this cell's mean
            r["p50_rise_within_one_decode_step"] = r["encode_p50_rise_ms"] <= step
            r["p99_rise_within_one_decode_step"] = r["encode_p99_rise_ms"] <= step
        gate = on["gate"]
        r["no_batch_waited_past_one_step"] = gate["past_one_step"] == 0 and gate["longer_than_step"] == 0
    report = {"command": "python -m benchmarks.work_stealing " + " ".join(sys.argv[1:] if argv is None else argv),
              "cluster": "encode-0 + llm-steal-0 (combined, time-shares encode-0's device) + 1 remote combined worker, "
                         "2 CPU cores, pass-through batching",
              "stealing": {"remote_load_threshold": a.threshold, "max_stolen": a.max_stolen},
              "llm_max_num_seqs": a.max_num_seqs, "model": str(a.model or BENCH_MODEL), "pinned": "encode-0 + llm-steal-0 on core 0, llm-0-combined on core 1",
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workloads": results}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    table = Table(title="work stealing: on vs off, same trace")
    for col in ("workload", "stealing", "req/s", "tok/s", "stolen", "encode p50 ms", "encode p99 ms",
                "batches waited / past one step", "mean stolen decode step ms"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        for side in ("off", "on"):
            s = r[side]
            table.add_row(name, side, f"{s['throughput_rps']:.2f}", f"{s['output_tokens_per_s']:.1f}", str(s["stolen_requests"]),
                          str(s["encode_latency_ms"]["p50"]), str(s["encode_latency_ms"]["p99"]),
                          f"{s['gate']['waited']:g} / {s['gate']['past_one_step'] + s['gate']['longer_than_step']:g}",
                          str(s["stolen_step_ms"]["mean_decode_only"]))
    console.print(table)
    for name, r in results.items():
        steps = r["on"]["stolen_step_ms"]
        console.print(f"{name}: throughput x{r['throughput_ratio_on_vs_off']} (tokens/s x{r['tokens_per_s_ratio_on_vs_off']}); "
                      f"encode latency p50 {r['encode_p50_rise_ms']:+} ms, p99 {r['encode_p99_rise_ms']:+} ms; stolen steps: "
                      f"mean {steps['mean']} ms, mean decode-only {steps['mean_decode_only']} ms; "
                      f"no batch waited past one step: {r['no_batch_waited_past_one_step']}")
    console.print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
