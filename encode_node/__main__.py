"""`python -m encode_node --worker-id e0 ...`: run one encode worker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from coordinator.protocol.logs import setup_logging
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from coordinator.protocol.process import run_until_signalled
from encode_node.config import EncodeWorkerConfig


def parse(argv: list[str] | None) -> EncodeWorkerConfig:
    p = argparse.ArgumentParser(prog="python -m encode_node", description="Run one tierserve encode worker.")
    p.add_argument("--worker-id", required=True, help="unique id in the cluster registry")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--key-prefix", default="tierserve", help="namespace of all Redis keys")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="local checkpoint dir (default: tiny LLaVA)")
    p.add_argument("--model-name", default="tiny-llava")
    p.add_argument("--max-batch-size", type=int, default=8, help="most requests per encoder forward pass")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--transport", default="local", help="embedding transport backend")
    p.add_argument("--tier", default="cpu", help="GPU tier name from the catalog, or cpu")
    a = p.parse_args(argv)
    return EncodeWorkerConfig(
        worker_id=a.worker_id, redis_url=a.redis_url, key_prefix=a.key_prefix, model_dir=a.model,
        model_name=a.model_name, max_batch_size=a.max_batch_size, threads=a.threads,
        transport=a.transport, tier=a.tier,
    )


async def amain(cfg: EncodeWorkerConfig) -> None:
    import torch

    from encode_node.encoder import LlavaImageEncoder
    from encode_node.worker import EncodeWorker

    torch.set_num_threads(cfg.threads)
    encoder = LlavaImageEncoder(cfg.model_dir, cfg.device)
    await run_until_signalled(cfg.redis_url, lambda redis, stop: EncodeWorker(cfg, redis, encoder).run(stop))


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    setup_logging(f"encode:{cfg.worker_id}")
    asyncio.run(amain(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
