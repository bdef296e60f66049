"""Only the vision layers whose output LLaVA reads.

LLaVA takes its image features from the vision tower's hidden states at `vision_feature_layer` (-2 in LLaVA-1.5:
the second-to-last layer's output), but transformers runs the whole tower and drops the rest. The layers after the
deepest one read never count, so they are removed at load (vLLM builds its LLaVA vision tower the same way): CLIP-L
in LLaVA-1.5 loses 1 of 24 layers, the shipped tiny LLaVA 1 of 2. The features are the same to the bit: hidden
state i is the output after i layers whatever follows (tests/encode_node/test_vision_layers.py), and the config's
feature layer is rewritten to count from the front, so it names the same state in the shorter tower.
"""

from __future__ import annotations

import logging

from torch import nn

log = logging.getLogger(__name__)


def _layer_list(tower: nn.Module) -> nn.ModuleList | None:
    """The tower's one stack of encoder layers (a ModuleList named ...encoder.layers), or None."""
    found = [m for name, m in tower.named_modules()
             if isinstance(m, nn.ModuleList) and (name == "encoder.layers" or name.endswith(".encoder.layers"))]
    return found[0] if len(found) == 1 else None


def drop_unread_layers(llava: nn.Module) -> int:
    """Remove the vision layers after the deepest one `llava.config.vision_feature_layer` reads; returns how many.
    `llava` is a transformers LlavaModel (vision_tower, config); nothing changes if its tower has no single layer
    stack or every layer is read."""
    config = llava.config
    layers = _layer_list(llava.vision_tower)
    if layers is None:
        log.info("vision tower kept whole: no single encoder layer stack found",
                 extra={"tower": type(llava.vision_tower).__name__})
        return 0
    n = len(layers)
    read = config.vision_feature_layer
    picked = [read] if isinstance(read, int) else list(read)
    states = [i if i >= 0 else n + 1 + i for i in picked]  # hidden state i: the output after i layers
    if any(not 0 <= s <= n for s in states):
        raise ValueError(f"vision_feature_layer {read!r} is outside a tower of {n} layers")
    keep = max(*states, 1)  # transformers records hidden states at the layers: with none there are none
    if keep == n:
        return 0
    del layers[keep:]
    config.vision_feature_layer = states[0] if isinstance(read, int) else states
    config.vision_config.num_hidden_layers = keep
    return n - keep
