"""`python -m llm_node --worker-id l0 --role combined ...`: run one LLM worker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from coordinator.protocol.logs import setup_logging
from coordinator.protocol.process import run_until_signalled
from coordinator.protocol.roles import LLM_ROLES
from coordinator.protocol.worker_config import add_worker_args, worker_fields
from llm_node.config import ENGINE_KINDS, LLMWorkerConfig


def parse(argv: list[str] | None) -> LLMWorkerConfig:
    p = argparse.ArgumentParser(prog="python -m llm_node", description="Run one tierserve LLM worker.")
    add_worker_args(p)
    p.add_argument("--role", choices=LLM_ROLES, default="combined",
                   help="combined = prefill+decode here; prefill hands KV to a decode worker")
    p.add_argument("--engine", choices=ENGINE_KINDS, default="reference",
                   help="reference: tierserve's PyTorch engine (exact, the test oracle); vllm: vLLM's engine "
                        "(install it with `make vllm`); null: no model, one instant token per request per step, for "
                        "measuring the serving path (coordinator capacity), --role combined only")
    p.add_argument("--kv-cache-mib", type=int, default=256,
                   help="--engine vllm: MiB for the KV cache (default 256; vLLM would otherwise size it from memory)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="most sequences per engine step")
    p.add_argument("--max-held", type=int, default=None,
                   help="most requests taken from this worker's job stream at once; more wait there and count in "
                        "its load (default: twice --max-num-seqs)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="most tokens per step (default: max(4096, the model's context length))")
    p.add_argument("--drain-timeout-s", type=float, default=0.0,
                   help="on SIGTERM, seconds to finish the requests held here while nothing new is routed here "
                        "(rolling restarts); the rest is re-run elsewhere (default: 0, stop at once)")
    p.add_argument("--colocate-with", default=None, metavar="ENCODE_WORKER_ID",
                   help="this worker shares that encode worker's GPU: with --role prefill it takes the share s of "
                        "its prefills (space sharing); with --role combined it steals whole requests while the "
                        "encoder is idle (time sharing)")
    a = p.parse_args(argv)
    if a.colocate_with and a.engine != "reference":
        p.error("--colocate-with needs --engine reference: sharing an encode GPU steps the engine in this "
                "process, and vLLM runs its engine core in a process of its own")
    if a.engine == "null" and a.role != "combined":
        p.error(f"--engine null needs --role combined, not {a.role}: the null engine has no KV cache to hand from "
                "a prefill worker to a decode worker")
    if a.colocate_with and a.role == "decode":
        p.error("--colocate-with needs --role prefill or combined: a decode worker never shares an encode GPU "
                "(decode streams the KV cache; SM partitioning does not isolate memory bandwidth)")
    return LLMWorkerConfig(**worker_fields(a), role=a.role, max_num_seqs=a.max_num_seqs,
                           max_num_batched_tokens=a.max_num_batched_tokens, colocated_with=a.colocate_with,
                           max_held=a.max_held, engine=a.engine, kv_cache_mib=a.kv_cache_mib,
                           drain_timeout_s=a.drain_timeout_s)


async def amain(cfg: LLMWorkerConfig) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from coordinator.protocol.colocation import ColocationChannel, channel_path
    from llm_node.engines import build_engine
    from llm_node.gpu_share import LLMGpuShare
    from llm_node.preemption import PrefillPreemption
    from llm_node.worker import LLMWorker
    from native.stream_partition import StreamPartition
    from transport.registry import make_receiver, make_sender

    torch.set_num_threads(cfg.threads)
    hf_logging.disable_progress_bar()
    built = build_engine(cfg)
    engine = built.engine
    # The prefix is part of the receiver's name so two clusters on one host never share a socket.
    receiver = make_receiver(cfg.transport, f"{cfg.key_prefix}-{cfg.worker_id}", **cfg.receiver_options())
    share = None
    if cfg.colocated_with is not None:
        channel = ColocationChannel(channel_path(cfg.key_prefix, cfg.colocated_with))
        share = LLMGpuShare(channel, cfg.role, StreamPartition(cfg.device, "prefill"))
        if cfg.role == "combined":  # stealing: long prefills give way to the encoder between layers
            engine.preemption = PrefillPreemption(built.model, lambda: channel.encoder_busy)
    await run_until_signalled(cfg.redis_url, lambda redis, stop: LLMWorker(
        cfg, redis, engine, receiver, make_sender(cfg.transport, **cfg.sender_options()), share).run(stop))


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    setup_logging(f"llm:{cfg.worker_id}")
    asyncio.run(amain(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
