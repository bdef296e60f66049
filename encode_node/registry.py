"""Encoders by architecture (the checkpoint's `model_type`), imported only when chosen."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from encode_node.encoded import Encoder

ENCODERS: dict[str, str] = {
    "llava": "encode_node.encoder:LlavaImageEncoder",
    "qwen2_vl": "encode_node.qwen2_vl_encoder:Qwen2VLEncoder",
    "qwen2_audio": "encode_node.qwen2_audio_encoder:Qwen2AudioEncoder",
}
"""model_type -> "module:class"; each class takes (model_dir, device, torch dtype) and implements `Encoder`."""


def model_type(model_dir: Path) -> str:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())["model_type"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: cannot read the checkpoint's model_type ({e}); pass --model with a "
                         "transformers checkpoint directory") from None


def make_encoder(model_dir: Path, device: str = "cpu", dtype: str = "float32") -> Encoder:
    """The checkpoint's encoder on `device` in `dtype` (a torch dtype name)."""
    import torch

    kind = model_type(model_dir)
    if kind not in ENCODERS:
        raise ValueError(f"no encoder for model_type {kind!r} ({model_dir}); supported: {sorted(ENCODERS)}")
    module, cls = ENCODERS[kind].split(":")
    return getattr(importlib.import_module(module), cls)(Path(model_dir), device, getattr(torch, dtype))
