"""Model architectures as the performance model sees them: parameter counts and shapes, nothing more.

The roofline estimate needs FLOPs and bytes per forward pass, and the planner needs the sizes that
cross links (embeddings, KV caches) and that must fit in memory (weights). Presets cover the seeds'
models; `arch_from_hf_config` reads a LLaVA-style checkpoint's config.json (the local tiny model).
Preset numbers are published sizes, rounded; `notes` says which are estimates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from pydantic import BaseModel, ConfigDict, Field

from coordinator.planner.service import Modality


class EncoderArch(BaseModel):
    """A modality encoder (vision tower or audio encoder) together with its projector."""

    model_config = ConfigDict(frozen=True)

    params: float = Field(gt=0)
    """Parameters, encoder plus projector."""
    layers: int = Field(ge=1)
    """Transformer layers."""
    hidden: int = Field(ge=1)
    """Hidden size of the encoder's transformer."""
    input_tokens_per_output_token: float = Field(1.0, gt=0)
    """Encoder sequence positions per embedding token it emits: 4 for a 2x2 patch merger (Qwen2.5-VL),
    8 for Ultravox's frame stacking, 1 for LLaVA's CLIP (one embedding per patch)."""
    attention_span_tokens: int | None = Field(None, ge=1)
    """Windowed/chunked layers attend within chunks of this many encoder positions (a LLaVA-NeXT tile,
    a Qwen2.5-VL window, a 30 s Whisper chunk); None = every layer sees the whole sequence."""
    full_attention_layers: int = Field(0, ge=0)
    """Layers that attend over the whole sequence even when attention_span_tokens is set."""


class LLMArch(BaseModel):
    """The decoder-only language model."""

    model_config = ConfigDict(frozen=True)

    params: float = Field(gt=0)
    """Parameters (all of them are read once per forward pass)."""
    layers: int = Field(ge=1)
    """Decoder layers."""
    hidden: int = Field(ge=1)
    """Hidden size: the width of one embedding token."""
    heads: int = Field(ge=1)
    """Query heads (attention FLOPs scale with heads * head_dim)."""
    kv_heads: int = Field(ge=1)
    """Key/value heads (GQA/MQA: fewer than heads); the KV cache scales with it."""
    head_dim: int = Field(ge=1)
    """Width of one head."""


class ModelArch(BaseModel):
    """A multimodal model: the LLM, its encoders, and how many tokens each kind of media becomes."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Preset or checkpoint name; measured profiles record it so they are never applied to another model."""
    llm: LLMArch
    """The language model."""
    vision: EncoderArch | None = None
    """Vision tower for images and video frames; None for an audio-only model."""
    audio: EncoderArch | None = None
    """Audio encoder; None for a vision-only model."""
    tokens_per_image: int | None = Field(None, ge=1)
    """Embedding tokens for a typical image (fixed for LLaVA-1.5; resolution-dependent elsewhere)."""
    tokens_per_video_frame: float | None = Field(None, gt=0)
    """Embedding tokens per sampled video frame."""
    tokens_per_audio_second: float | None = Field(None, gt=0)
    """Embedding tokens per second of audio."""
    dtype_bytes: int = Field(2, ge=1, le=8)
    """Bytes per weight, activation and KV element (2 for BF16, 4 for FP32)."""
    notes: str = ""
    """Where the numbers come from and which are estimates."""

    def encoder(self, modality: Modality) -> EncoderArch:
        enc = self.audio if modality == "audio" else self.vision
        if enc is None:
            raise ValueError(f"model {self.name!r} has no encoder for {modality!r} input; "
                             f"it takes {self.modalities()}")
        return enc

    def modalities(self) -> list[Modality]:
        mods: list[Modality] = ["image", "video"] if self.vision else []
        return mods + (["audio"] if self.audio else [])

    def tokens_per_item(self, modality: Modality) -> float:
        """Embedding tokens for one image, one video frame or one second of audio."""
        value = {"image": self.tokens_per_image, "video": self.tokens_per_video_frame,
                 "audio": self.tokens_per_audio_second}[modality]
        if value is None:
            raise ValueError(f"model {self.name!r} does not say how many tokens one {modality} item makes")
        return value

    def embedding_bytes(self, tokens: float) -> int:
        """Bytes of `tokens` embedding tokens: what crosses from encode to prefill."""
        return int(round(tokens * self.llm.hidden * self.dtype_bytes))

    def embedding_bytes_per_item(self, modality: Modality) -> int:
        """Bytes of one image's, one video frame's or one audio second's embeddings."""
        return self.embedding_bytes(self.tokens_per_item(modality))

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token adds (keys and values, every layer): what crosses prefill -> decode."""
        return 2 * self.llm.layers * self.llm.kv_heads * self.llm.head_dim * self.dtype_bytes

    def llm_weight_bytes(self) -> float:
        return self.llm.params * self.dtype_bytes

    def encoder_weight_bytes(self) -> float:
        """Every encoder's weights: an encode GPU holds all the model's encoders."""
        return sum(e.params for e in (self.vision, self.audio) if e is not None) * self.dtype_bytes


def _clip336(projector_out: int) -> EncoderArch:
    # CLIP ViT-L/14-336: 303.5M, plus a 2-layer MLP projector 1024 -> d -> d.
    return EncoderArch(params=303.5e6 + 1024 * projector_out + projector_out**2, layers=24, hidden=1024,
                       attention_span_tokens=577)


def _qwen25_vit(merger_out: int) -> EncoderArch:
    # 32 layers, hidden 1280, 2x2 merger; windows of 8x8 patches except 4 full-attention layers.
    return EncoderArch(params=0.67e9 + 5120 * merger_out, layers=32, hidden=1280, input_tokens_per_output_token=4,
                       attention_span_tokens=64, full_attention_layers=4)


PRESETS: Mapping[str, ModelArch] = MappingProxyType({
    "llava-1.5-7b": ModelArch(
        name="llava-1.5-7b", vision=_clip336(4096), tokens_per_image=576,
        llm=LLMArch(params=6.74e9, layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128),
        notes="Vicuna-7B + CLIP ViT-L/14-336; 576 tokens per image (fixed 336px)."),
    "llava-v1.6-34b": ModelArch(
        name="llava-v1.6-34b", vision=_clip336(7168), tokens_per_image=2880,
        llm=LLMArch(params=34.4e9, layers=60, hidden=7168, heads=56, kv_heads=8, head_dim=128),
        notes="Yi-34B + CLIP; anyres 672x672 = 4 tiles + base = 2880 tokens (an upper estimate)."),
    "qwen2.5-vl-7b": ModelArch(
        name="qwen2.5-vl-7b", vision=_qwen25_vit(3584), tokens_per_image=1024, tokens_per_video_frame=128,
        llm=LLMArch(params=7.62e9, layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128),
        notes="Qwen2.5-7B + 675M ViT; tokens depend on resolution: 1024 = 896x896 image, "
              "128/frame = 448x448 video (2 frames per temporal patch); both estimates."),
    "qwen2.5-vl-32b": ModelArch(
        name="qwen2.5-vl-32b", vision=_qwen25_vit(5120), tokens_per_image=1024, tokens_per_video_frame=128,
        llm=LLMArch(params=32.8e9, layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128),
        notes="Qwen2.5-32B + 675M ViT; token counts as for qwen2.5-vl-7b (estimates)."),
    "ultravox": ModelArch(
        name="ultravox", tokens_per_audio_second=6.25,
        audio=EncoderArch(params=0.74e9, layers=32, hidden=1280, input_tokens_per_output_token=8,
                          attention_span_tokens=1500),
        llm=LLMArch(params=27.0e9, layers=62, hidden=5376, heads=32, kv_heads=16, head_dim=128),
        notes="Ultravox v0.6: Whisper-large-v3 encoder (637M, 50 frames/s, 30 s chunks) + ~0.1B stacking "
              "projector (8 frames per token, estimate) + Gemma-3-27B (sliding-window KV ignored)."),
})


def _hf_dtype_bytes(config: dict) -> int:
    name = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(name, 2)


def arch_from_hf_config(path: str | Path, name: str | None = None) -> ModelArch:
    """A LLaVA-style checkpoint (CLIP vision tower + Llama-like LLM) from its config.json.

    Parameter counts are computed from the shapes (biases and norms ignored: under 1% of any real model).
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
        v, t = config["vision_config"], config["text_config"]
        vh, vi, vl = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
        patches = (v["image_size"] // v["patch_size"]) ** 2
        h, inter, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
        heads = t["num_attention_heads"]
        kv_heads = t.get("num_key_value_heads", heads)
        head_dim = t.get("head_dim") or h // heads
        vocab = t["vocab_size"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{file}: not a readable LLaVA-style config.json ({exc!r}); "
                         f"give a checkpoint directory with vision_config and text_config") from None
    vision_params = (vl * (4 * vh * vh + 2 * vh * vi) + 3 * v["patch_size"] ** 2 * vh + (patches + 1) * vh
                     + vh * h + h * h)
    embeddings = vocab * h * (1 if t.get("tie_word_embeddings", False) else 2)
    llm_params = layers * (2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * inter) + embeddings
    keep_cls = config.get("vision_feature_select_strategy", "default") == "full"
    return ModelArch(
        name=name or path.name, dtype_bytes=_hf_dtype_bytes(config), tokens_per_image=patches + keep_cls,
        vision=EncoderArch(params=vision_params, layers=vl, hidden=vh),
        llm=LLMArch(params=llm_params, layers=layers, hidden=h, heads=heads, kv_heads=kv_heads, head_dim=head_dim),
        notes=f"computed from {file}")


def get_arch(name: str) -> ModelArch:
    """A preset by name, `tiny-llava` (the shipped checkpoint), or a checkpoint directory's config."""
    if name in PRESETS:
        return PRESETS[name]
    if name == "tiny-llava":
        from coordinator.protocol.models import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME

        return arch_from_hf_config(DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME)
    if Path(name).exists():
        return arch_from_hf_config(name)
    raise KeyError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}, tiny-llava, "
                   f"or a checkpoint directory holding a LLaVA-style config.json")
