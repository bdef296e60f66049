"""drop_unread_layers: the vision layers after the deepest feature layer go, the features stay the same to the bit."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaModel, SiglipVisionConfig, SiglipVisionModel

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from encode_node.encoder import LlavaImageEncoder
from encode_node.vision_layers import _layer_list, drop_unread_layers


def _llava(feature_layer, layers: int = 4) -> LlavaModel:
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
                              image_size=32, patch_size=8)
    text = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=64)
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_layer=feature_layer, image_token_id=5)
    return LlavaModel(config).eval()


@torch.inference_mode()
def _features(model: LlavaModel, pixels: torch.Tensor) -> list[torch.Tensor]:
    return list(model.get_image_features(pixel_values=pixels).pooler_output)


@pytest.mark.parametrize("feature_layer,dropped,kept_index", [(-2, 1, 3), (1, 3, 1), (0, 3, 0), ([-3, -2], 1, [2, 3]),
                                                              ([-4, 2], 2, [1, 2])])
def test_features_are_unchanged_to_the_bit(feature_layer, dropped, kept_index):
    whole = _llava(feature_layer)
    short = copy.deepcopy(whole)
    pixels = torch.randn(2, 3, 32, 32)
    assert drop_unread_layers(short) == dropped
    assert len(_layer_list(short.vision_tower)) == 4 - dropped
    assert short.config.vision_feature_layer == kept_index
    assert all(torch.equal(a, b) for a, b in zip(_features(whole, pixels), _features(short, pixels)))


def test_nothing_goes_when_the_last_layer_is_read():
    model = _llava([-3, -1])
    assert drop_unread_layers(model) == 0
    assert len(_layer_list(model.vision_tower)) == 4 and model.config.vision_feature_layer == [-3, -1]


def test_a_feature_layer_outside_the_tower_is_refused():
    with pytest.raises(ValueError, match="outside a tower of 4 layers"):
        drop_unread_layers(_llava(-6))


def test_the_layer_stack_is_found_in_other_towers_and_not_in_a_module_without_one():
    siglip = SiglipVisionModel(SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                                  num_attention_heads=2, image_size=16, patch_size=8))
    assert len(_layer_list(siglip)) == 3
    assert _layer_list(torch.nn.Linear(2, 2)) is None


def test_the_shipped_llava_encoder_runs_one_of_its_two_layers():
    lean, whole = LlavaImageEncoder(DEFAULT_MODEL_DIR), LlavaImageEncoder(DEFAULT_MODEL_DIR, lean=False)
    assert (lean.dropped_layers, whole.dropped_layers) == (1, 0)
    assert (len(_layer_list(lean.model.vision_tower)), len(_layer_list(whole.model.vision_tower))) == (1, 2)
    assert lean.pixels is not None and whole.pixels is None
