"""Prefill that gives way to the encoder between decoder layers (a stealing worker's long steps).

A stealing worker holds its encode GPU for one engine step at a time; a decode step is short, but a
prefill of a few hundred tokens is many decode steps long, and an encode micro-batch arriving during
it would wait for all of it. So while armed, a hook before each decoder layer asks `should_yield`
(the encoder's busy flag) and, if it says yes, abandons the forward with `Preempted`. That is safe
because the engine's `execute` changes no sequence state (sampling comes after the forward): the
step is simply retried once the encoder is done. The wait an encoder batch sees is then at most one
decoder layer of prefill, or one decode step.

A prefill preempted `max_in_a_row` times running is allowed to finish the next time (`disarmed_once`),
so a steady stream of micro-batches cannot starve stolen requests forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn


class Preempted(Exception):
    """The encoder wants the GPU: this prefill forward stopped between layers and changed nothing."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The language model's decoder layers (LLaVA-style `.model.language_model.layers`, or `.model.layers`)."""
    for path in ("model.language_model.layers", "model.layers", "language_model.model.layers"):
        obj: object = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList) and len(obj):
            return obj
    raise ValueError(f"{type(model).__name__} has no decoder layers where preemption looks for them")


class PrefillPreemption:
    def __init__(self, model: nn.Module, should_yield: Callable[[], bool], max_in_a_row: int = 3) -> None:
        self.should_yield = should_yield
        self.max_in_a_row = max_in_a_row
        self.armed = False
        self.in_a_row = 0
        self.total = 0
        """Prefill forwards abandoned so far."""
        self._handles = [layer.register_forward_pre_hook(self._hook) for layer in decoder_layers(model)]

    def _hook(self, module: nn.Module, args: tuple) -> None:
        if self.armed and self.should_yield():
            self.in_a_row += 1
            self.total += 1
            raise Preempted

    @contextmanager
    def prefill(self) -> Iterator[None]:
        """Around a prefill forward: preemptible unless it was preempted `max_in_a_row` times running."""
        self.armed = self.in_a_row < self.max_in_a_row
        try:
            yield
            self.in_a_row = 0
        finally:
            self.armed = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
