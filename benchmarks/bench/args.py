"""The command line of `tierserve bench`; every flag's help says what it changes and its unit."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench.presets import PRESETS
from coordinator.planner.durations import duration_arg

EPILOG = """examples:
  # one server, Poisson at 2 req/s, 200 image requests, SLO TTFT <= 500 ms and TPOT <= 50 ms
  tierserve bench --target http://127.0.0.1:8000 --request-rate 2 --num-requests 200 --goodput ttft:500 tpot:50

  # start a local CPU cluster, compare two configurations at three rates, priced from the catalog
  tierserve bench --target local --preset passthrough-epd,tierserve --sweep-rate 1,2,4 \\
      --num-requests 40 --output-tokens 16 --goodput ttft:2000 tpot:200 --gpus 1xRTX4090,1xA100

  # plain vLLM against tierserve on the vLLM engine, same model and workload, this machine, rates to saturation
  tierserve bench --target vllm --target local-vllm --sweep-rate 1,2,4,8,16 --num-requests 40 \
      --output-tokens 32 --goodput ttft:2000 tpot:200

  # any other OpenAI-compatible server (vLLM, ...) next to a tierserve coordinator, one workload
  tierserve bench --target vllm=http://gpu1:8000 --target ts=http://gpu2:8000 --sweep-rate 2,4,8 \\
      --goodput ttft:1000 tpot:60 --gpus vllm=4xA100 --gpus ts=2xRTX4090,2xA100

  # a plan from `tierserve plan`, simulated, next to the live cluster it describes
  tierserve bench --target sim:plan.yaml --target live=http://127.0.0.1:8000 --sweep-rate 1,2,4 --goodput ttft:2000 tpot:100

  # replay a recorded trace at its own pace
  tierserve bench --target http://127.0.0.1:8000 --dataset trace.jsonl --request-rate trace

presets (applied with PUT /v1/admin/policy on tierserve targets; see benchmarks/bench/presets.py):
""" + "\n".join(f"  {p.name:<16} {p.summary}" for p in PRESETS.values()) + """

--dataset: JSON lines, one request each: {"prompt": TEXT, "images": [PATH|URL, ...], "audio": PATH,
"output_tokens": N, "timestamp": SECONDS} or {"messages": [...OpenAI messages...], ...}; see
benchmarks/bench/dataset.py for the full format.

outputs (in --out): bench.json (command, git revision, seed, workload, summaries, every request's
record), table.txt, goodput_vs_rate.png, latency_cdf.png, cost_per_goodput.png (when priced).
exit status: 0 done; 1 no request completed; 2 bad input or an unusable target; 130 interrupted.
"""


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tierserve bench", description=description, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_argument_group("what to measure")
    t.add_argument("--target", action="append", metavar="[NAME=]URL|local|local-vllm|vllm|sim[:PLAN]",
                   help="an OpenAI-compatible server's base URL (with or without /v1); `local` starts a tierserve "
                        "CPU cluster for the run (`local-vllm`: its LLM workers on the vLLM engine); `vllm` starts "
                        "plain `vllm serve` on the same model (monolithic, the peer); `sim:PLAN.yaml` (or `sim` with --plan) replays the workload on the "
                        "planner's simulator for a plan file from `tierserve plan`. Repeat to compare "
                        "(default: http://127.0.0.1:8000)")
    t.add_argument("--preset", action="append", metavar="NAME[,NAME]",
                   help=f"tierserve configurations to compare on each tierserve target: {', '.join(PRESETS)} "
                        "(default: none, the server as it is)")
    t.add_argument("--plan", type=Path, help="plan file for --target sim (see benchmarks/bench/sim_target.py)")
    t.add_argument("--model", help="`model` sent in requests (default: the first of the target's GET /v1/models)")
    t.add_argument("--api-key", help="sent as `Authorization: Bearer KEY` to every target")
    t.add_argument("--admin-token", help="bearer token for tierserve's /v1/admin/policy, when the coordinator sets one")
    t.add_argument("--local-model", type=Path, help="--target local: checkpoint dir (default: the tiny LLaVA)")
    t.add_argument("--local-encode", type=int, default=1, help="--target local: encode workers (default: %(default)s)")
    t.add_argument("--local-threads", type=int, default=1, metavar="N",
                   help="--target local: torch threads per worker process (default: %(default)s)")
    t.add_argument("--local-no-pin", action="store_true",
                   help="--target local: do not pin each emulated GPU's workers to one CPU core")
    t.add_argument("--interleave", action="store_true",
                   help="start every live target at once and run each rate on all of them before the next rate "
                        "(default: target after target); fairer on a shared host whose speed drifts, as a rate's "
                        "cells then run minutes closer (a target waiting its turn stays up, idle)")

    w = p.add_argument_group("workload")
    w.add_argument("--request-rate", default="inf",
                   help="mean arrivals per second (Poisson, or Gamma with --burstiness); inf sends all at once; "
                        "trace replays --dataset timestamps (default: %(default)s)")
    w.add_argument("--sweep-rate", metavar="R1,R2,...", help="several rates, each a cell per system (overrides --request-rate)")
    w.add_argument("--burstiness", type=float, default=1.0,
                   help="Gamma shape of the gaps: 1 = Poisson, <1 burstier, >1 more regular; gap CV = 1/sqrt(it) (default: 1)")
    w.add_argument("--max-concurrency", type=int, help="most requests in flight; later arrivals wait for a slot")
    w.add_argument("--num-requests", type=int, help="requests per cell (default: 100, or the dataset's lines)")
    w.add_argument("--duration", type=duration_arg("--duration"), metavar="TIME",
                   help="arrivals per cell, with a unit: 90s, 2min (requests arriving later are not sent)")
    w.add_argument("--seed", type=int, default=0,
                   help="seeds arrivals and synthetic requests; each rate gets requests of its own, the same for "
                        "every target (default: %(default)s)")
    w.add_argument("--warmup", type=int, default=2, help="unrecorded sequential requests before each system (default: 2)")
    w.add_argument("--modality", default="image", help="request kinds and weights, e.g. image or image:0.8,text:0.2 "
                                                       "(text, image, video, audio; default: %(default)s)")
    w.add_argument("--images-per-request", default="1", help="N, uniform:LO:HI or normal:MEAN:SD (default: %(default)s)")
    w.add_argument("--image-size", default="336x336", help="WxH[,WxH...], drawn uniformly per image (default: %(default)s)")
    w.add_argument("--prompt-tokens", default="32", help="text prompt length, approx. tokens: N, uniform:LO:HI or "
                                                         "normal:MEAN:SD (default: %(default)s)")
    w.add_argument("--output-tokens", default="64", help="max_tokens per request, same forms (default: %(default)s)")
    w.add_argument("--audio-seconds", type=float, default=2.0, help="length of synthetic audio clips (default: 2)")
    w.add_argument("--video-frames", type=int, default=4, help="frames per synthetic video (default: 4)")
    w.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (for servers that reject it; output lengths then vary by system)")
    w.add_argument("--dataset", type=Path, help="JSONL file of requests to replay instead of synthetic ones (every "
                                                "rate sends the same requests, so a server with a prefix or encoder "
                                                "cache answers later rates partly from it; synthetic requests differ "
                                                "from rate to rate)")
    w.add_argument("--timeout", type=duration_arg("--timeout"), default=300.0, metavar="TIME",
                   help="time before one request counts as a timeout, with a unit: 300s, 5min (default: 300s)")

    s = p.add_argument_group("SLO and cost")
    s.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLO targets: ttft:MS tpot:MS [e2el:MS]; a bare number is milliseconds, units us, ms, s, "
                        "min may be given (ttft:2s); a request is good if it meets all")
    s.add_argument("--cost-per-hour", action="append", default=[], metavar="[SYSTEM=]USD",
                   help="the system's price in $/h (repeat with SYSTEM= to price systems differently)")
    s.add_argument("--gpus", action="append", default=[], metavar="[SYSTEM=]2xRTX4090,2xA100",
                   help="price the system from the planner's GPU catalog")
    s.add_argument("--catalog", action="append", default=[], type=Path, help="extra catalog YAML overriding prices")

    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory (default: %(default)s)")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument("--quiet", action="store_true", help="no progress bar or table (for CI); errors still go to stderr")
    return p
