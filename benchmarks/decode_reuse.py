"""What a reference-engine decode step costs when it reuses the kept padded cache vs when it rebuilds it.

In-process (llm_node's ModelRunner on the embedded tiny LLaVA, no serving stack): B sequences with
prompts like sim_fidelity's workload (an image's 196 placeholder rows + 16-128 text tokens + template),
decoded step after step. "reuse": the same sequences go on (DecodeBatches keeps the cache); "rebuild":
the kept batch is dropped before every step, as a join or leave did up to b0e73de (llm_node/kv.py). Since
7944618 (llm_node/batch_cache.py) a join or leave copies one row, so "rebuild" now measures a fresh layout,
which only a joiner longer than the window or a full buffer causes; results/decode_reuse.json is b0e73de's. Also
the per-step work the engine does outside its step timer (appending each sequence's new KV column).
Run it pinned, one torch thread, as the workers run:

    taskset -c 1 python -m benchmarks.decode_reuse --threads 1 --out /tmp/decode_reuse.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def _runner(threads: int):
    import transformers
    from transformers import LlavaForConditionalGeneration

    from coordinator.protocol.models import DEFAULT_MODEL_DIR
    from llm_node.model_runner import ModelRunner

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    return ModelRunner(LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval())


def measure(runner, batch: int, steps: int, rng: random.Random) -> dict:
    """Median seconds of `runner.decode` (the engine's step timer) and of the appends after it, for steps
    that rebuild (every other one: the kept batch dropped before it) and the steps that reuse between them.
    Interleaved, so the host's drift (2 shared cores) falls on both alike."""
    prompts = [[rng.randrange(5, 1000) for _ in range(rng.randint(230, 340))] for _ in range(batch)]
    result = runner.prefill(prompts, [None] * batch)
    kvs, tokens = result.kvs, result.logits.argmax(-1).tolist()
    runner.decode_batches.clear()
    step_s: dict[bool, list[float]] = {True: [], False: []}
    append_s = []
    for i in range(2 * steps + 1):
        rebuild = i % 2 == 1
        if rebuild:
            runner.decode_batches.clear()
        t0 = time.perf_counter()
        out = runner.decode(tokens, kvs)
        t1 = time.perf_counter()
        for j, kv in enumerate(kvs):
            kv.append(out.new_kv[:, :, j])
        t2 = time.perf_counter()
        tokens = out.logits.argmax(-1).tolist()
        if i:  # the first step always builds
            step_s[rebuild].append(t1 - t0)
            append_s.append(t2 - t1)
    runner.decode_batches.clear()
    return {"batch": batch, "reuse_s": statistics.median(step_s[False]), "rebuild_s": statistics.median(step_s[True]),
            "append_s": statistics.median(append_s), "padded_context": batch * max(kv.length for kv in kvs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=30, help="rebuild/reuse step pairs per run")
    ap.add_argument("--rounds", type=int, default=3, help="runs per batch (fresh prompts each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    runner = _runner(args.threads)
    rng = random.Random(0)
    measure(runner, 4, 10, rng)  # warm-up
    rows = []
    for b in args.batches:
        rs = [measure(runner, b, args.steps, rng) for _ in range(args.rounds)]
        row = {"batch": b, "padded_context": round(statistics.median(r["padded_context"] for r in rs))}
        row |= {k.replace("_s", "_ms"): round(1e3 * statistics.median(r[k] for r in rs), 3)
                for k in ("reuse_s", "rebuild_s", "append_s")}
        rows.append(row)
        print(f"B={b:2d}  reuse {row['reuse_ms']:.3f} ms  rebuild {row['rebuild_ms']:.3f} ms  "
              f"(+{row['rebuild_ms'] - row['reuse_ms']:.3f})  append {row['append_ms']:.3f} ms  "
              f"padded ctx {row['padded_context']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": args.threads, "steps": args.steps, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
