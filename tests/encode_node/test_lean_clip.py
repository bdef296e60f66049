"""LeanClipFeatures: LLaVA's image features from a CLIP tower as plain tensor operations, equal to the bit to
transformers' get_image_features, and only where it applies."""

from __future__ import annotations

import copy

import pytest
import torch
from media_factory import image_bytes
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaModel, SiglipVisionConfig

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from encode_node.encoder import LlavaImageEncoder
from encode_node.lean_clip import LeanClipFeatures
from encode_node.vision_layers import drop_unread_layers


def _llava(feature_layer=-2, strategy: str = "default", vision=None) -> LlavaModel:
    torch.manual_seed(0)
    vision = vision or CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                                        image_size=32, patch_size=8)
    text = LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=64)
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_layer=feature_layer,
                         vision_feature_select_strategy=strategy, image_token_id=5)
    return LlavaModel(config).eval()


@torch.inference_mode()
def _reference(model: LlavaModel, pixels: torch.Tensor) -> list[torch.Tensor]:
    return list(model.get_image_features(pixel_values=pixels).pooler_output)


@pytest.mark.parametrize("feature_layer,strategy,truncate", [(-2, "default", False), (-2, "default", True),
                                                             (-1, "full", False), (1, "default", True),
                                                             (0, "full", False)])
def test_features_equal_get_image_features_to_the_bit(feature_layer, strategy, truncate):
    model = _llava(feature_layer, strategy)
    want = _reference(model, pixels := torch.randn(3, 3, 32, 32))
    if truncate:
        model = copy.deepcopy(model)
        drop_unread_layers(model)
    lean, why = LeanClipFeatures.wrap(model)
    assert why is None
    with torch.inference_mode():
        got = lean(pixels)
    assert len(got) == 3 and got[0].shape == want[0].shape == ((16 if strategy == "default" else 17), 48)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_wrong_image_size_is_refused_as_transformers_refuses_it():
    lean, _ = LeanClipFeatures.wrap(_llava())
    with pytest.raises(ValueError, match="doesn't match model"):
        lean(torch.randn(1, 3, 40, 40))


def test_what_it_does_not_cover_is_left_to_transformers():
    assert LeanClipFeatures.wrap(_llava([-3, -2]))[1] == "vision_feature_layer [-3, -2] is not one layer of the tower"
    siglip = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                image_size=32, patch_size=8)
    assert "SiglipVisionModel" in LeanClipFeatures.wrap(_llava(vision=siglip))[1]
    assert LeanClipFeatures.wrap(_llava().train())[1] == "the model is in training mode"


def test_the_encoder_uses_the_model_forward_while_a_hook_is_registered():
    """A forward hook (e.g. a profiler's or a preemption check's) runs only through nn.Module calls: with one
    registered the encoder takes transformers' forward, and the features are the same."""
    lean, whole = LlavaImageEncoder(DEFAULT_MODEL_DIR), LlavaImageEncoder(DEFAULT_MODEL_DIR, lean=False)
    assert lean.features is not None and whole.features is None
    media = [[image_bytes(1, 300, 200, "PNG")], [image_bytes(2, 224, 400, "JPEG"), image_bytes(3, 100, 100, "PNG")]]
    want = whole.encode(media).per_request
    calls = []
    handle = lean.model.vision_tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        assert lean.features.hooked()
        hooked = lean.encode(media).per_request
    finally:
        handle.remove()
    assert calls and not lean.features.hooked()
    plain = lean.encode(media).per_request
    assert len(calls) == 1  # the lean path ran without the tower's module call
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(want, hooked, plain))


def test_transformers_own_capture_hooks_do_not_count_and_a_global_hook_does():
    model = _llava()
    lean, _ = LeanClipFeatures.wrap(model)
    _reference(model, torch.randn(1, 3, 32, 32))  # installs transformers' output-capturing hooks, kept from then on
    assert any(m._forward_hooks for m in model.modules())
    assert not lean.hooked()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert lean.hooked()
    finally:
        handle.remove()
    assert not lean.hooked()
