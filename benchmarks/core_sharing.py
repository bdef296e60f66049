"""How much of a CPU core two processes time-slicing it get in all: the simulator's `core_sharing`.

The simulator's shared cores (coordinator/planner/sim_gpu.py) give k busy processes 1/k of the core each.
On a real core the scheduler switches between them every few milliseconds and each switch costs the one
coming back its caches (the tiny model's weights and activations, the interpreter's working set), so the
two get less than one core in all. This measures that share: each of two real workloads runs alone on the
core, then both together, pinned to the same core, and

    sharing = rate_A(together) / rate_A(alone) + rate_B(together) / rate_B(alone)

(1.0: perfect processor sharing). The workloads are the cluster's own: `encode` (the tiny LLaVA's encoder
on one 336 px image, encode_node's LlavaImageEncoder), `prefill` (the language model's forward over 315
tokens, a request of the fidelity layouts), `decode` (one step of 4 sequences over a 320-token cache) and
`stack` (the coordinator's kind of work in pure Python: a token event's JSON round trip and pydantic
validation). Every measurement is alone, together, alone again (the host's speed drifts; the two alone
rates are averaged), in rounds; the JSON keeps every round.

    python -m benchmarks.core_sharing --pairs encode+prefill prefill+stack encode+decode --rounds 3 \\
        --out benchmarks/results/core_sharing.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.progress import Progress

from benchmarks.bench.report import write_json

KINDS = ("encode", "prefill", "decode", "stack")
WARMUP_OPS = 20


def _workload(kind: str) -> Callable[[int], None]:
    """One unit of `kind`'s work, ready to call (models loaded, inputs built)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from coordinator.protocol.models import DEFAULT_MODEL_DIR

    if kind == "encode":
        from benchmarks.bench.media import synthetic_image
        from encode_node.encoder import LlavaImageEncoder

        enc = LlavaImageEncoder(DEFAULT_MODEL_DIR)
        rng = np.random.default_rng(0)
        raws = [synthetic_image(rng, 336, 336) for _ in range(4)]
        return lambda i: enc.encode([[raws[i % len(raws)]]])
    if kind in ("prefill", "decode"):
        from transformers import AutoModelForImageTextToText

        lm = AutoModelForImageTextToText.from_pretrained(DEFAULT_MODEL_DIR).eval().model.language_model
        gen = torch.Generator().manual_seed(0)
        if kind == "prefill":
            ids = torch.randint(0, 1000, (1, 315), generator=gen)

            def prefill(_: int) -> None:
                with torch.inference_mode():
                    lm(input_ids=ids)
            return prefill
        with torch.inference_mode():
            cache = lm(input_ids=torch.randint(0, 1000, (4, 320), generator=gen), use_cache=True).past_key_values
        step = torch.randint(0, 1000, (4, 1), generator=gen)

        def decode(_: int) -> None:
            with torch.inference_mode():
                lm(input_ids=step, past_key_values=cache, use_cache=False)
                cache.crop(320)
        return decode
    if kind == "stack":
        import json

        from coordinator.protocol.messages import TokenEvent

        event = {"request_id": "r" * 32, "index": 7, "token_ids": [11, 22, 33], "text": "a few words",
                 "finish_reason": None, "worker_id": "llm-0", "batch_size": 4}

        def stack(i: int) -> None:
            for _ in range(50):
                TokenEvent.model_validate(json.loads(json.dumps({**event, "index": i})))
        return stack
    raise ValueError(f"unknown workload {kind!r}; one of {', '.join(KINDS)}")


def ready_op(kind: str, core: int, ready: mp.Queue, go: mp.Event) -> Callable[[int], None]:
    """In a spawned process: pin it to `core`, load `kind`'s workload and warm it up, say so on `ready`, wait for
    `go`; the operation to repeat."""
    os.sched_setaffinity(0, {core})
    op = _workload(kind)
    for i in range(WARMUP_OPS):
        op(i)
    ready.put(kind)
    go.wait()
    return op


def _run(kind: str, core: int, seconds: float, ready: mp.Queue, go: mp.Event, out: mp.Queue) -> None:
    op = ready_op(kind, core, ready, go)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        op(n)
        n += 1
    out.put((kind, n / (time.perf_counter() - t0)))


def run_together(target: Callable, args: list[tuple], seconds: float) -> list:
    """One spawned process per `args` entry, `target(*entry, ready, go, out)`: each loads its workload and puts
    something on `ready`, all start together on `go` and each puts its result on `out` (returned, in arrival order)."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*a, ready, go, out)) for a in args]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=300)
        go.set()
        return [out.get(timeout=seconds + 120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def measure(kinds: list[str], core: int, seconds: float) -> list[float]:
    """Operations per second of each of `kinds`, run at once on `core` (one process each)."""
    got = run_together(_run, [(k, core, seconds) for k in kinds], seconds)
    if len({k for k in kinds}) == 1:
        return sorted(r for _, r in got)
    rates = dict(got)
    return [rates[k] for k in kinds]


def pair_round(a: str, b: str, core: int, seconds: float) -> dict:
    """Alone, together, alone again; the sharing of one round."""
    before = [measure([k], core, seconds)[0] for k in (a, b)]
    together = measure([a, b], core, seconds)
    after = [measure([k], core, seconds)[0] for k in (a, b)]
    alone = [(x + y) / 2 for x, y in zip(before, after)]
    return {"alone_per_s": alone, "alone_before_after_per_s": [before, after], "together_per_s": together,
            "sharing": sum(t / s for t, s in zip(together, alone))}


def parse_pair(text: str) -> tuple[str, str]:
    parts = text.split("+")
    if len(parts) != 2 or any(p not in KINDS for p in parts):
        raise argparse.ArgumentTypeError(f"a pair is A+B with A and B among {', '.join(KINDS)}, got {text!r}")
    return parts[0], parts[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.core_sharing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=parse_pair, nargs="+", default=[("encode", "prefill")], metavar="A+B",
                   help=f"workload pairs to run on one core, A and B among {', '.join(KINDS)} (default: encode+prefill)")
    p.add_argument("--rounds", type=int, default=3, help="alone/together/alone rounds per pair (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=6.0, help="seconds each measurement runs (default: %(default)s)")
    p.add_argument("--core", type=int, default=0, help="the CPU core every process is pinned to (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.seconds <= 0:
        p.error("--rounds must be >= 1 and --seconds > 0")
    if a.core not in os.sched_getaffinity(0):
        p.error(f"--core {a.core} is not one this process may run on ({sorted(os.sched_getaffinity(0))})")
    rows = []
    with Progress() as bar:
        task = bar.add_task("core sharing", total=len(a.pairs) * a.rounds)
        for x, y in a.pairs:
            rounds = []
            for _ in range(a.rounds):
                rounds.append(pair_round(x, y, a.core, a.seconds))
                bar.advance(task)
            shares = [r["sharing"] for r in rounds]
            rows.append({"pair": f"{x}+{y}", "rounds": rounds, "sharing_median": statistics.median(shares),
                         "sharing_min": min(shares), "sharing_max": max(shares)})
            bar.console.print(f"{x}+{y}: sharing {statistics.median(shares):.3f} (rounds "
                              f"{', '.join(f'{s:.3f}' for s in shares)}; alone "
                              f"{rounds[0]['alone_per_s'][0]:.1f} and {rounds[0]['alone_per_s'][1]:.1f} ops/s)")
    overall = statistics.median(s for r in rows for s in (rr["sharing"] for rr in r["rounds"]))
    print(f"median over every round: {overall:.3f} of the core in all for two busy processes (1.0: no loss)")
    if a.out:
        write_json(a.out, {"command": " ".join(["python -m benchmarks.core_sharing", *sys.argv[1:]]),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "core": a.core,
                           "seconds": a.seconds, "sharing_median": overall, "pairs": rows})


if __name__ == "__main__":
    main()
