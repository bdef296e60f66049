"""`python -m llm_node.tiny_models NAME [--out DIR]`: write one tiny random-weight checkpoint.

NAME is one of `qwen2-vl`, `qwen2-audio` (the tiny LLaVA has its own script: `python -m llm_node.tiny_model`).
The default output is coordinator/assets/tiny-<NAME>, where the tests and `tierserve up --model` find it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coordinator.protocol.models import ASSETS_DIR

GENERATORS = {"qwen2-vl": "llm_node.tiny_models.qwen2_vl", "qwen2-audio": "llm_node.tiny_models.qwen2_audio"}


def main(argv: list[str] | None = None) -> int:
    import importlib

    parser = argparse.ArgumentParser(prog="python -m llm_node.tiny_models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(GENERATORS))
    parser.add_argument("--out", type=Path, default=None, help="directory to write (default: assets/tiny-NAME)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the weights (default: %(default)s)")
    args = parser.parse_args(argv)
    out = args.out or ASSETS_DIR / f"tiny-{args.name}"
    path = importlib.import_module(GENERATORS[args.name]).generate(out, seed=args.seed)
    size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    print(f"wrote {path} ({size:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
