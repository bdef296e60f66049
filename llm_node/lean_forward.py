"""Llama's decoder stack run as plain tensor operations: transformers' own forward, less its per-call Python.

On a CPU with a small model, a forward is as much Python as arithmetic: transformers' LlamaModel goes through ~50
nn.Module calls, output-capturing decorators and ~60 config attribute lookups per step. Without them a decode step
of the tiny LLaVA took 0.4-0.6 ms less (in-process, min of 60: 3.14 -> 2.74 ms at one sequence, 8.11 -> 7.54 at 32). `LeanLlama` runs the same operations, in the same order, on the same
tensors (the model's own weights, its own rotary embedding, mask builder, rotary function and attention
function), calling the kernels directly, so its outputs are bit for bit those of the model's forward
(tests/llm_node/test_lean_forward.py checks prefill and decode logits with torch.equal).

Only a plain `LlamaModel` (the LLaVA family's language model) is taken, with its stock layer classes; any other
decoder (Qwen2-VL's M-RoPE, Qwen2's sliding windows) keeps transformers' forward (`LeanLlama.wrap` returns None).
Module hooks only run through nn.Module calls, so while any is registered on the model or its submodules (a
stealing worker's preemption checks between layers, llm_node/preemption.py) `hooked` says to use the model's
forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama import modeling_llama as llama

from coordinator.protocol.module_hooks import foreign_hooks


class LeanLlama:
    """Call with the arguments the runner gives LlamaModel; returns its last hidden state."""

    def __init__(self, model: llama.LlamaModel) -> None:
        self.model = model
        self.config = model.config
        self.head_dim = model.layers[0].self_attn.head_dim
        self._modules = list(model.modules())
        """Every module whose hooks `hooked` checks (a model's modules are fixed once loaded)."""

    @classmethod
    def wrap(cls, model: torch.nn.Module) -> LeanLlama | None:
        """A LeanLlama for `model` if it is a stock LlamaModel in inference mode, else None."""
        stock = (type(model) is llama.LlamaModel and not model.training
                 and all(type(layer) is llama.LlamaDecoderLayer and type(layer.self_attn) is llama.LlamaAttention
                         and type(layer.mlp) is llama.LlamaMLP for layer in model.layers))
        return cls(model) if stock else None

    def hooked(self) -> bool:
        """Whether a forward hook is registered on the model, any of its modules, or globally (transformers' own
        output-capturing hooks aside: coordinator/protocol/module_hooks.py)."""
        return foreign_hooks(self._modules)

    @staticmethod
    def _norm(norm: llama.LlamaRMSNorm, h: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        h = h.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + norm.variance_epsilon)
        return norm.weight * h.to(dtype)

    def __call__(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                 past_key_values) -> torch.Tensor:
        m = self.model
        mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                  past_key_values=past_key_values, position_ids=position_ids)
        # looked up at every call, as the model's own forward does
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, llama.eager_attention_forward)
        h = inputs_embeds
        cos, sin = m.rotary_emb(h, position_ids=position_ids)
        shape = (*h.shape[:-1], -1, self.head_dim)
        for i, layer in enumerate(m.layers[: self.config.num_hidden_layers]):
            attn, mlp = layer.self_attn, layer.mlp
            residual = h
            h = self._norm(layer.input_layernorm, h)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(shape).transpose(1, 2)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(shape).transpose(1, 2)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(shape).transpose(1, 2)
            q, k = llama.apply_rotary_pos_emb(q, k, cos, sin)
            k, v = past_key_values.update(k, v, i)
            out, _ = attention(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling,
                                    position_ids=position_ids, use_cache=True)
            out = out.reshape(*shape[:-2], -1).contiguous()
            h = residual + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            residual = h
            h = self._norm(layer.post_attention_layernorm, h)
            gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
            h = residual + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        return self._norm(m.norm, h)
