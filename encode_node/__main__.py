"""`python -m encode_node --worker-id e0 ...`: run one encode worker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys

from coordinator.protocol.logs import setup_logging
from coordinator.protocol.process import run_until_signalled
from coordinator.protocol.worker_config import add_worker_args, worker_fields
from encode_node.config import EncodeWorkerConfig


def parse(argv: list[str] | None) -> EncodeWorkerConfig:
    p = argparse.ArgumentParser(prog="python -m encode_node", description="Run one tierserve encode worker.")
    add_worker_args(p)
    p.add_argument("--max-batch-size", type=int, default=8, help="most requests per encoder forward pass")
    p.add_argument("--drain-timeout-s", type=float, default=0.0,
                   help="on SIGTERM, seconds to finish the micro-batches released here while nothing new is routed "
                        "here (0: stop at once; the coordinator re-runs what this worker held)")
    a = p.parse_args(argv)
    return EncodeWorkerConfig(**worker_fields(a), max_batch_size=a.max_batch_size, drain_timeout_s=a.drain_timeout_s)


async def amain(cfg: EncodeWorkerConfig) -> None:
    import torch

    from encode_node.registry import make_encoder
    from encode_node.worker import EncodeWorker

    torch.set_num_threads(cfg.threads)
    cfg.check_device()
    encoder = make_encoder(cfg.model_dir, cfg.device, cfg.dtype)
    await run_until_signalled(cfg.redis_url, lambda redis, stop: EncodeWorker(cfg, redis, encoder).run(stop))


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    setup_logging(f"encode:{cfg.worker_id}")
    asyncio.run(amain(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
