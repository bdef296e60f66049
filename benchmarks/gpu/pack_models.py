"""Full-size architectures with random weights for the GPU pack: configs here, weights only on the GPU.

- LLaVA-1.5-7B: CLIP ViT-L/14-336 vision tower (24 layers, 1024 wide, 577 positions) + 2-layer MLP
  projector to a Llama-7B language model (32 layers, 4096 wide, 32 heads, MLP 11008, vocab 32064).
- Qwen2-VL-7B's vision tower: 32 layers, 1280 wide, 16 heads, patch 14, 2x2 merger to 3584.

No weights can be downloaded there, and timing does not depend on their values: random init, bf16.
Building a config touches no GPU, so `--check-only` builds them all.
"""

from __future__ import annotations

from typing import Any

LLAVA_IMAGE_TOKENS = 576
"""CLIP ViT-L/14-336: (336/14)^2 patches, the CLS row dropped by LLaVA's default feature select."""
QWEN2VL_IMAGE_SIDE = 448
"""Qwen2-VL test images: 448x448 -> 32x32 patches of 14 -> 256 tokens after the 2x2 merger."""


def llava_config(text_layers: int = 32) -> Any:
    """LLaVA-1.5-7B's config (`text_layers` < 32 only for a quick look)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                              image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")
    text = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=text_layers,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
                       rms_norm_eps=1e-5)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_id=32000,
                       vision_feature_layer=-2, vision_feature_select_strategy="default")


def qwen2vl_vision_config() -> Any:
    """Qwen2-VL-7B's config (its vision tower is what is timed)."""
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        vision_config={"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "num_heads": 16, "mlp_ratio": 4,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
        text_config={"hidden_size": 3584, "num_hidden_layers": 1, "num_attention_heads": 28, "num_key_value_heads": 4,
                     "intermediate_size": 18944, "vocab_size": 152064})


def on_device(build, device: str, dtype) -> Any:
    """`build()` with its parameters created directly on `device` in `dtype` (a 7B model never sits on the CPU)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = build()
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def llava_model(device: str, dtype, text_layers: int = 32) -> Any:
    from transformers import LlavaForConditionalGeneration

    return on_device(lambda: LlavaForConditionalGeneration(llava_config(text_layers)), device, dtype)


def qwen2vl_visual(device: str, dtype) -> Any:
    """Qwen2-VL-7B's vision tower alone (Qwen2VisionTransformerPretrainedModel)."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    cfg = qwen2vl_vision_config().vision_config
    return on_device(lambda: Qwen2VisionTransformerPretrainedModel._from_config(cfg), device, dtype)


def qwen2vl_inputs(batch: int, device: str, dtype) -> tuple[Any, Any]:
    """(flattened patches, grid_thw) of `batch` QWEN2VL_IMAGE_SIDE-square images, as its processor makes them."""
    import torch

    side = QWEN2VL_IMAGE_SIDE // 14
    cfg = qwen2vl_vision_config().vision_config
    per_patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    pixels = torch.randn(batch * side * side, per_patch, device=device, dtype=dtype)
    grid = torch.tensor([[1, side, side]] * batch, device=device)
    return pixels, grid
