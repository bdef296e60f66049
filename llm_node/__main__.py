"""`python -m llm_node --worker-id l0 --role combined ...`: run one LLM worker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from coordinator.protocol.logs import setup_logging
from coordinator.protocol.process import run_until_signalled
from coordinator.protocol.worker_config import add_worker_args, worker_fields
from llm_node.config import LLMWorkerConfig


def parse(argv: list[str] | None) -> LLMWorkerConfig:
    p = argparse.ArgumentParser(prog="python -m llm_node", description="Run one tierserve LLM worker.")
    add_worker_args(p)
    p.add_argument("--role", choices=["combined", "prefill", "decode"], default="combined",
                   help="combined = prefill+decode here; prefill hands KV to a decode worker")
    p.add_argument("--max-num-seqs", type=int, default=32, help="most sequences per engine step")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="most tokens per step (default: max(4096, the model's context length))")
    p.add_argument("--colocate-with", default=None, metavar="ENCODE_WORKER_ID",
                   help="this worker shares that encode worker's GPU: with --role prefill it takes the share s of "
                        "its prefills (space sharing); with --role combined it steals whole requests while the "
                        "encoder is idle (time sharing)")
    a = p.parse_args(argv)
    if a.colocate_with and a.role == "decode":
        p.error("--colocate-with needs --role prefill or combined: a decode worker never shares an encode GPU "
                "(decode streams the KV cache; SM partitioning does not isolate memory bandwidth)")
    return LLMWorkerConfig(**worker_fields(a), role=a.role, max_num_seqs=a.max_num_seqs,
                           max_num_batched_tokens=a.max_num_batched_tokens, colocated_with=a.colocate_with)


async def amain(cfg: LLMWorkerConfig) -> None:
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from coordinator.protocol.colocation import ColocationChannel, channel_path
    from llm_node.architectures import load_model
    from llm_node.engine import EngineConfig, ReferenceEngine
    from llm_node.gpu_share import LLMGpuShare
    from llm_node.preemption import PrefillPreemption
    from llm_node.worker import LLMWorker
    from native.stream_partition import StreamPartition
    from transport.registry import make_receiver, make_sender

    torch.set_num_threads(cfg.threads)
    hf_logging.disable_progress_bar()
    model = load_model(cfg.model_dir, torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    context = getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0
    budget = cfg.max_num_batched_tokens or max(4096, context)
    if budget < context:
        raise SystemExit(f"--max-num-batched-tokens {budget} is below the model's context length {context}: "
                         f"prompts the API accepts could never be prefilled; raise it to at least {context}")
    engine = ReferenceEngine(model, tokenizer, EngineConfig(
        role=cfg.role, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=budget))
    # The prefix is part of the receiver's name so two clusters on one host never share a socket.
    receiver = make_receiver(cfg.transport, f"{cfg.key_prefix}-{cfg.worker_id}", **cfg.receiver_options())
    share = None
    if cfg.colocated_with is not None:
        channel = ColocationChannel(channel_path(cfg.key_prefix, cfg.colocated_with))
        share = LLMGpuShare(channel, cfg.role, StreamPartition("cpu", "prefill"))
        if cfg.role == "combined":  # stealing: long prefills give way to the encoder between layers
            engine.preemption = PrefillPreemption(model, lambda: channel.encoder_busy)
    await run_until_signalled(cfg.redis_url, lambda redis, stop: LLMWorker(
        cfg, redis, engine, receiver, make_sender(cfg.transport), share).run(stop))


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    setup_logging(f"llm:{cfg.worker_id}")
    asyncio.run(amain(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
