"""LLaVA's image features from a CLIP vision tower as plain tensor operations: transformers' forward, less its
per-call Python.

`LlavaModel.get_image_features` goes through the output-capturing and config-merging decorators, ~20 nn.Module
calls per layer and a BaseModelOutput per call; on a CPU with a small tower that Python is as long as the arithmetic.
`LeanClipFeatures` runs the same operations in the same order on the same tensors (the model's own weights, its
attention function from transformers' registry, its activation modules), so the features are those of
get_image_features to the bit (tests/encode_node/test_lean_clip.py). It stops at the feature layer (the layers
after it are gone anyway, vision_layers.py) and skips the pooled CLS output, which LLaVA never reads.

Only a stock `CLIPVisionModel` tower with its stock layer classes, one feature layer and the "default" or "full"
select strategy: `LeanClipFeatures.wrap` returns None (and the caller keeps get_image_features) otherwise, and for
a model with any forward hook registered.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.clip import modeling_clip as clip

from coordinator.protocol.module_hooks import foreign_hooks


class LeanClipFeatures:
    """`lean(pixel_values)` -> list of [tokens, hidden] features, one per image, as get_image_features' pooler_output."""

    def __init__(self, llava: torch.nn.Module) -> None:
        self.llava = llava
        tower = llava.vision_tower
        self.embeddings, self.pre_norm = tower.embeddings, tower.pre_layrnorm
        self.layers = list(tower.encoder.layers)
        self.feature_state = self._state(llava.config.vision_feature_layer, len(self.layers))
        """Hidden state read: the output after this many layers."""
        self.drop_cls = llava.config.vision_feature_select_strategy == "default"
        self.projector = llava.multi_modal_projector
        self._modules = list(llava.modules())

    @staticmethod
    def _state(layer: int, n: int) -> int:
        return layer if layer >= 0 else n + 1 + layer

    @classmethod
    def wrap(cls, llava: torch.nn.Module) -> tuple[LeanClipFeatures | None, str | None]:
        """(LeanClipFeatures, None) for a stock CLIP-towered LLaVA in inference mode, else (None, why not)."""
        tower = getattr(llava, "vision_tower", None)
        if type(tower) is not clip.CLIPVisionModel:
            return None, f"the vision tower is {type(tower).__name__}, not a CLIPVisionModel"
        if llava.training:
            return None, "the model is in training mode"
        layers = tower.encoder.layers
        if not all(type(l) is clip.CLIPEncoderLayer and type(l.self_attn) is clip.CLIPAttention
                   and type(l.mlp) is clip.CLIPMLP for l in layers):
            return None, "the tower's layers are not CLIP's stock classes"
        layer = llava.config.vision_feature_layer
        if not isinstance(layer, int) or not 0 <= cls._state(layer, len(layers)) <= len(layers):
            return None, f"vision_feature_layer {layer!r} is not one layer of the tower"
        if llava.config.vision_feature_select_strategy not in ("default", "full"):
            return None, f"select strategy {llava.config.vision_feature_select_strategy!r}"
        if len(layers) == 0:
            return None, "the tower has no layers"
        if tower.embeddings.patch_embedding.padding_mode != "zeros":
            return None, "the patch embedding pads other than with zeros"
        return cls(llava), None

    def hooked(self) -> bool:
        """Whether a forward hook is registered on the model, any of its modules, or globally (transformers' own
        output-capturing hooks aside: coordinator/protocol/module_hooks.py)."""
        return foreign_hooks(self._modules)

    def _embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        e = self.embeddings
        batch, _, height, width = pixel_values.shape
        if height != e.image_size or width != e.image_size:
            raise ValueError(f"Input image size ({height}*{width}) doesn't match model ({e.image_size}*{e.image_size}).")
        conv = e.patch_embedding
        patches = F.conv2d(pixel_values.to(dtype=conv.weight.dtype), conv.weight, conv.bias, conv.stride, conv.padding,
                           conv.dilation, conv.groups)
        patches = patches.flatten(2).transpose(1, 2)
        h = torch.cat([e.class_embedding.expand(batch, 1, -1), patches], dim=1)
        return h + F.embedding(e.position_ids, e.position_embedding.weight)

    @staticmethod
    def _layer_norm(norm: torch.nn.LayerNorm, h: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def _attention(self, attn: clip.CLIPAttention, h: torch.Tensor) -> torch.Tensor:
        input_shape = h.shape[:-1]
        hidden_shape = (*input_shape, -1, attn.head_dim)
        q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(hidden_shape).transpose(1, 2)
        k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(hidden_shape).transpose(1, 2)
        v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(hidden_shape).transpose(1, 2)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                          clip.eager_attention_forward)
        out, _ = interface(attn, q, k, v, None, scaling=attn.scale, dropout=0.0)
        out = out.reshape(*input_shape, -1).contiguous()
        return F.linear(out, attn.out_proj.weight, attn.out_proj.bias)

    def _layer(self, layer: clip.CLIPEncoderLayer, h: torch.Tensor) -> torch.Tensor:
        h = h + self._attention(layer.self_attn, self._layer_norm(layer.layer_norm1, h))
        mlp = layer.mlp
        x = F.linear(self._layer_norm(layer.layer_norm2, h), mlp.fc1.weight, mlp.fc1.bias)
        return h + F.linear(mlp.activation_fn(x), mlp.fc2.weight, mlp.fc2.bias)

    def __call__(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        h = self._layer_norm(self.pre_norm, self._embed(pixel_values))
        for layer in self.layers[: self.feature_state]:
            h = self._layer(layer, h)
        if self.drop_cls:
            h = h[:, 1:]
        p = self.projector
        h = F.linear(p.act(F.linear(h, p.linear_1.weight, p.linear_1.bias)), p.linear_2.weight, p.linear_2.bias)
        return list(h)
