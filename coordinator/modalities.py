"""What prompt building needs to know from a checkpoint's processor, per modality: the placeholder the
chat template renders once per item, and how many tokens an item of a given size expands to.

Counts come from the processor's own code where it has one (LLaVA's `_get_num_multimodal_tokens`,
Qwen2-VL's `get_number_of_image_patches`), so the prompt holds exactly as many placeholders as the
encoder will produce embeddings. Qwen2-VL is read from its components (tokenizer + image processor)
because transformers' Qwen2VLProcessor needs torchvision for a video processor this project does
not use (video frames go through the image processor; encode_node/video_patches.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.protocol.messages import Modality


@dataclass(frozen=True)
class ProcessorParts:
    """A processor assembled from a checkpoint's components, for models whose processor class cannot load."""

    tokenizer: Any
    image_processor: Any = None
    feature_extractor: Any = None

    def apply_chat_template(self, messages: list[dict], **kw) -> str:
        return self.tokenizer.apply_chat_template(messages, **kw)


def load_processor(model_dir: Path | str) -> Any:
    """AutoProcessor, or (when it cannot load, e.g. Qwen2-VL without torchvision) the components."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(model_dir)
    except ImportError:
        return ProcessorParts(AutoTokenizer.from_pretrained(model_dir), AutoImageProcessor.from_pretrained(model_dir))


class ProcessorView:
    """Placeholders and token counts per modality; `placeholders` lists what this model accepts."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", None)
        tok, ip = self.tokenizer, getattr(processor, "image_processor", None)
        fe = getattr(processor, "feature_extractor", None)

        def token(name: str) -> str | None:
            return getattr(processor, name, None) or getattr(tok, name, None)

        self.placeholders: dict[Modality, str] = {}
        """Modality -> the token the chat template renders once per item of it."""
        if token("image_token") and (hasattr(processor, "_get_num_multimodal_tokens")
                                     or hasattr(ip, "get_number_of_image_patches")):
            self.placeholders["image"] = token("image_token")
        if token("video_token") and hasattr(ip, "temporal_patch_size") and hasattr(ip, "get_number_of_image_patches"):
            self.placeholders["video"] = token("video_token")
        if token("audio_token") and hasattr(fe, "hop_length") and hasattr(fe, "n_samples"):
            self.placeholders["audio"] = token("audio_token")
        if tok is None or not self.placeholders:
            raise TypeError(f"{type(processor).__name__} cannot say how many tokens an image, video or audio clip "
                            "takes; need a LLaVA-style, Qwen2-VL or Qwen2-Audio processor")
        self.image_processor, self.feature_extractor = ip, fe

    def image_tokens(self, sizes: list[tuple[int, int]]) -> list[int]:
        """Tokens of each image of (height, width)."""
        if not sizes:
            return []
        if hasattr(self.processor, "_get_num_multimodal_tokens"):
            return list(self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens)
        ip = self.image_processor
        return [ip.get_number_of_image_patches(h, w, {}) // ip.merge_size**2 for h, w in sizes]

    def video_tokens(self, frames: int, height: int, width: int) -> int:
        """Frames paired into temporal patches, each frame resized like an image (encode_node/video_patches.py)."""
        ip = self.image_processor
        groups = math.ceil(frames / ip.temporal_patch_size)
        return groups * ip.get_number_of_image_patches(height, width, {}) // ip.merge_size**2

    def audio_tokens(self, samples: int) -> int:
        """Qwen2-Audio: mel frames (one per hop), conv stride 2, then average pooling by 2."""
        frames = min(math.ceil(samples / self.feature_extractor.hop_length), self.feature_extractor.nb_max_frames)
        return (((frames - 1) // 2 + 1) - 2) // 2 + 1

    @property
    def audio_rate(self) -> int:
        return self.feature_extractor.sampling_rate

    @property
    def audio_window_s(self) -> float:
        """The longest clip the encoder sees whole (Whisper pads or cuts every clip to this)."""
        return self.feature_extractor.n_samples / self.feature_extractor.sampling_rate

    def render(self, messages: list[dict]) -> str:
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
