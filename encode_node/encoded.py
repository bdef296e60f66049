"""What every encoder returns for a micro-batch, and the per-request decoding that lets one bad
media item fail its own request only."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch
from PIL import Image

from coordinator.protocol.messages import EncodedMedia, Modality

T = TypeVar("T")


@dataclass
class EncodedBatch:
    per_request: list[torch.Tensor | None]
    """One [n_tokens, hidden] tensor per request, media in prompt order; None where it failed."""
    errors: list[str | None]
    """Why a request's media could not be decoded (it alone fails; the batch goes on)."""
    seconds: float
    """Wall time of decoding, preprocessing and the forward pass, for the whole batch."""
    media: list[list[EncodedMedia]] = field(default_factory=list)
    """Per request, per media item: its rows of the tensor and its grid (travels in the PrefillJob)."""


class Encoder(Protocol):
    """The encode worker's view of an encoder (DESIGN: `encode(batch of media) -> tensors + metadata`)."""

    modalities: frozenset[str]
    """The modalities this checkpoint can encode."""
    placeholder_ids: frozenset[int]
    """Prompt token ids that embeddings fill: counting them sizes a batch before encoding."""
    hidden_size: int

    def encode(self, items_per_request: list[list[bytes]], modality: Modality = "image") -> EncodedBatch: ...


def load_media_side(model_class: str, model_dir, device: str, dtype: torch.dtype):
    """(the checkpoint's media side: towers + projector, on `device` in `dtype`; its config). The language
    model is dropped right after loading, on the CPU, so an encode GPU holds only what encodes."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = getattr(transformers, model_class).from_pretrained(model_dir, dtype=dtype)
    model.model.language_model = None
    model.lm_head = None
    return model.model.eval().to(device), model.config


def decode_image(raw: bytes) -> Image.Image:
    with Image.open(io.BytesIO(raw)) as im:
        return im.convert("RGB")


def decode_each(items_per_request: list[list[bytes]], decode: Callable[[bytes], T], what: str
                ) -> tuple[list[list[T] | None], list[str | None]]:
    """Decode every request's items; a request with an undecodable item gets None and a reason."""
    decoded: list[list[T] | None] = []
    errors: list[str | None] = []
    for raws in items_per_request:
        try:
            decoded.append([decode(raw) for raw in raws])
            errors.append(None)
        except Exception as e:  # e.g. a truncated JPEG that passed the coordinator's header check
            decoded.append(None)
            errors.append(f"{what} could not be decoded: {e}")
    return decoded, errors


def split_per_request(decoded: list[list | None], feats: list[torch.Tensor], hidden: int
                      ) -> list[torch.Tensor | None]:
    """Regroup per-item features (flat, in batch order) into one tensor per request."""
    out: list[torch.Tensor | None] = []
    i = 0
    for items in decoded:
        if items is None:
            out.append(None)
            continue
        chunk = feats[i : i + len(items)]
        i += len(items)
        out.append(torch.cat(chunk) if chunk else torch.empty(0, hidden))
    return out


def check_modality(encoder: Encoder, modality: str) -> None:
    if modality not in encoder.modalities:
        raise ValueError(f"{type(encoder).__name__} encodes {sorted(encoder.modalities)}, not {modality}; "
                         "the coordinator should have refused this request")
