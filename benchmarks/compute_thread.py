"""Does it matter which thread runs an engine step? One dedicated thread against steps handed round the threads.

A live LLM worker ran its steps with `asyncio.to_thread`, which takes whichever default-executor thread is
free; with the transport's off-loop checksums in the same pool, five threads shared its step CPU about
equally. This runs the reference engine in-process (the embedded tiny LLaVA, one torch thread; run it pinned
as the workers are) on a closed loop of requests like `tierserve bench`'s (196 image rows + text, 32 output
tokens), every step submitted from the caller to either one single-thread executor ("one", what
coordinator/protocol/compute_thread.py does now) or to N single-thread executors in turn ("rotate"),
alternating the two, and reports CPU (the process's) and wall time per request:

    taskset -c 1 python -m benchmarks.compute_thread --repeats 3 --out benchmarks/results/compute_thread.json
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch


def _engine(max_num_seqs: int):
    import transformers
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from coordinator.protocol.models import DEFAULT_MODEL_DIR
    from llm_node.engine import ReferenceEngine
    from llm_node.engine_config import EngineConfig

    transformers.utils.logging.disable_progress_bar()
    model = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval()
    tokenizer = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR).tokenizer
    return model, ReferenceEngine(model, tokenizer, EngineConfig(role="combined", max_num_seqs=max_num_seqs))


def closed_loop(model, engine, executors: list[ThreadPoolExecutor], concurrency: int, requests: int,
                text_tokens: int, seed: int) -> dict:
    """Keep `concurrency` requests in the engine until `requests` finished; step i on executors[i % len]."""
    from coordinator.protocol.messages import SamplingParams
    from llm_node.engine_api import EngineRequest

    rng = random.Random(seed)
    image_id, hidden = model.config.image_token_id, model.config.text_config.hidden_size

    def request(i: int) -> EngineRequest:
        ids = [1] + [image_id] * 196 + [rng.randrange(5, 900) for _ in range(text_tokens)]
        return EngineRequest(f"r{i}", ids, SamplingParams(max_tokens=32, ignore_eos=True),
                             mm_embeddings=torch.randn(196, hidden))

    sent = done = steps = 0
    while sent < concurrency:
        engine.add(request(sent))
        sent += 1
    turn = itertools.cycle(executors)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while done < requests:
        outputs = next(turn).submit(engine.step).result()
        steps += 1
        for out in outputs:
            if out.finished:
                done += 1
                if sent < requests:
                    engine.add(request(sent))
                    sent += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    while engine.has_unfinished():  # what is left of the last requests, unmeasured
        engine.step()
    return {"cpu_ms_per_request": 1e3 * cpu / requests, "wall_ms_per_request": 1e3 * wall / requests, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compute_thread", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=5, help="executors the 'rotate' arm hands steps to (default: 5)")
    p.add_argument("--concurrency", type=int, default=48, help="requests kept in the engine (default: 48)")
    p.add_argument("--requests", type=int, default=600, help="requests measured per run (default: 600)")
    p.add_argument("--text-tokens", type=int, default=80, help="text tokens after the image (default: 80)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="the engine's, as the LLM worker's default")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternating (default: 3)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/compute_thread.json"))
    a = p.parse_args(argv)
    if min(a.threads, a.concurrency, a.requests, a.repeats, a.max_num_seqs) < 1 or a.threads < 2:
        p.error("--threads must be >= 2 and every count >= 1")
    torch.set_num_threads(1)
    model, engine = _engine(a.max_num_seqs)
    arms = {"one": [ThreadPoolExecutor(1)], "rotate": [ThreadPoolExecutor(1) for _ in range(a.threads)]}
    closed_loop(model, engine, arms["one"], a.concurrency, a.concurrency, a.text_tokens, seed=-1)  # warm-up
    runs: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(a.repeats):
        for name, executors in arms.items():
            runs[name].append(closed_loop(model, engine, executors, a.concurrency, a.requests, a.text_tokens, seed=r))
            cpu = runs[name][-1]["cpu_ms_per_request"]
            print(f"repeat {r + 1} {name:6s} {cpu:.2f} ms CPU a request", file=sys.stderr)
    metrics = ("cpu_ms_per_request", "wall_ms_per_request")
    median = {k: {m: round(statistics.median(run[m] for run in v), 3) for m in metrics} for k, v in runs.items()}
    report = {
        "command": "python -m benchmarks.compute_thread " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "reference engine in-process, closed loop; CPU and wall ms per request with every step on one "
                f"thread ('one') or handed round {a.threads} threads ('rotate')",
        "settings": {k: v for k, v in vars(a).items() if k != "out"},
        "runs": runs, "median": median,
        "rotate_over_one": {m: round(median["rotate"][m] / median["one"][m], 3) for m in median["one"]},
    }
    from benchmarks.bench.report import write_json

    write_json(a.out, report)
    one, rotate = median["one"]["cpu_ms_per_request"], median["rotate"]["cpu_ms_per_request"]
    print(f"CPU ms a request, median: one thread {one:.2f}, rotating {rotate:.2f} "
          f"(x{report['rotate_over_one']['cpu_ms_per_request']}); wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
