"""Engines by name, imported only when chosen: `reference` (PyTorch, exact), `vllm` (vLLM's engine) and
`null` (no model: one instant token per request per step, for measuring the serving path; null_engine.py).

Selecting `vllm` imports vLLM; the CPU test suite and a worker on the reference engine never do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_node.config import LLMWorkerConfig
from llm_node.engine_api import Engine


@dataclass
class BuiltEngine:
    engine: Engine
    model: Any | None = None
    """The in-process torch model (reference engine: the stealing worker's preemption hooks it), else None."""


def build_engine(cfg: LLMWorkerConfig) -> BuiltEngine:
    """Load the worker's model into the engine `cfg.engine` names; SystemExit with a reason when it cannot."""
    if cfg.engine == "vllm":
        from llm_node.vllm_engine import build_vllm_engine

        return BuiltEngine(build_vllm_engine(cfg))
    if cfg.engine == "null":
        return _null(cfg)
    return _reference(cfg)


def _null(cfg: LLMWorkerConfig) -> BuiltEngine:
    """The checkpoint's tokenizer and context length, no weights."""
    from transformers import AutoConfig, AutoTokenizer

    from llm_node.null_engine import NullEngine

    context = _context_length(AutoConfig.from_pretrained(cfg.model_dir))
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    return BuiltEngine(NullEngine(tokenizer, cfg.engine_config(context), context or None))


def _reference(cfg: LLMWorkerConfig) -> BuiltEngine:
    from transformers import AutoTokenizer

    from llm_node.architectures import load_model
    from llm_node.engine import ReferenceEngine

    cfg.check_device()
    model = load_model(cfg.model_dir, cfg.torch_dtype()).to(cfg.device)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    return BuiltEngine(ReferenceEngine(model, tokenizer, cfg.engine_config(_context_length(model.config))), model)


def _context_length(config) -> int:
    return getattr(config.get_text_config(), "max_position_embeddings", 0) or 0
