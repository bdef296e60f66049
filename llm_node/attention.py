"""Masked grouped-query attention without copying the keys, for the reference engine on a CPU.

Transformers' "sdpa" attention lets PyTorch's SDPA handle grouped-query attention (fewer key/value heads
than query heads) only when there is no attention mask, because CUDA's fast kernels refuse a mask with
it. Otherwise it first copies every key and value head `num_key_value_groups` times (`repeat_kv`). The
engine always passes a mask (right-padded prefills, left-padded decode batches), so on a CPU each layer
of a decode step copied the batch's whole cache twice: at 32 sequences of ~290 positions that was
three quarters of the step. PyTorch's CPU kernels take a mask together with `enable_gqa` and give the
same bits (tests/llm_node/test_attention.py), so `gqa_sdpa` passes both there and leaves every other
case (no mask, no groups, another device) to transformers' own function.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "tierserve_cpu_gqa_sdpa"
"""The attention implementation's name in transformers' registry."""


def gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
             is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or isinstance(kwargs.get("cache"), PagedAttentionCache)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_gqa_sdpa(model) -> bool:
    """Switch `model` (on a CPU, using "sdpa") to `gqa_sdpa`; True if it was switched."""
    if model.device.type != "cpu" or model.config.get_text_config(decoder=True)._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
