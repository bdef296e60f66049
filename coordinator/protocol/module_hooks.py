"""Whether a model's plain-tensor forward (llm_node/lean_forward.py, encode_node/lean_clip.py) may run: module hooks
only fire through nn.Module calls, so any hook someone registered means the model's own forward must run.

transformers installs hooks of its own on a model's first forward (utils/output_capturing.py: they record hidden
states and attentions for `output_hidden_states` and the like) and keeps them; they act only while transformers'
own forward collects outputs, never in a plain-tensor forward, so they do not count. Without that exception the
first get_image_features (which asks for hidden states) would turn the lean path off for good.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_TRANSFORMERS_CAPTURE = ("transformers.utils.output_capturing", "output_capturing_hook")


def _own(hook) -> bool:
    return (getattr(hook, "__module__", None), getattr(hook, "__name__", None)) == _TRANSFORMERS_CAPTURE


def foreign_hooks(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether a forward hook or pre-hook, other than transformers' output-capturing ones, is registered globally
    or on any of `modules`."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_pre_hooks or nn_module._global_forward_hooks:
        return True
    return any(m._forward_pre_hooks or any(not _own(h) for h in m._forward_hooks.values()) for m in modules)
