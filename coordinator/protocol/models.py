"""Where the embedded models live; every node resolves `--model` against them."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL_DIR = ASSETS_DIR / "tiny-llava"
DEFAULT_MODEL_NAME = "tiny-llava"
QWEN2_VL_DIR = ASSETS_DIR / "tiny-qwen2-vl"
"""Tiny Qwen2-VL (image + video, M-RoPE), written by `python -m llm_node.tiny_models qwen2-vl`."""
QWEN2_AUDIO_DIR = ASSETS_DIR / "tiny-qwen2-audio"
"""Tiny Qwen2-Audio (Whisper-style encoder), written by `python -m llm_node.tiny_models qwen2-audio`."""
