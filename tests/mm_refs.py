"""References for the Qwen2-VL and Qwen2-Audio exactness tests: the model's own `generate()` on raw
inputs (pixels or PCM, grids, token types), and the media bytes an encoder gets for the same request.

The prompt is built the way transformers' processors build it: chat template, each placeholder
expanded to its token count, tokenized. (Qwen2VLProcessor itself needs torchvision for its video
processor, so for Qwen2-VL the tokenizer and image processor are used directly; the expansion is the
processor's `replace_image_token`/`replace_video_token`.)
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import torch
from media_factory import image_bytes
from PIL import Image

from coordinator.protocol.frames import pack_frames
from encode_node.video_patches import video_pixels


@dataclass
class MMRef:
    name: str
    prompt_ids: list[int]
    modality: str
    """"image", "video", "audio", or "text"; "image+video" only in engine-level cases."""
    media: list[bytes]
    """What the encode worker gets per item: PNG bytes, packed frames, or float32 PCM."""
    tokens: list[int]
    logits: list[torch.Tensor]
    raw: dict = field(default_factory=dict)
    """Per-modality raw items for the encoder ({"image": [...], "video": [...]})."""


def _rgb(raw: bytes) -> Image.Image:
    return Image.open(io.BytesIO(raw)).convert("RGB")


def _generate(model, inputs: dict, n: int) -> tuple[list[int], list[torch.Tensor]]:
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None)
    k = inputs["input_ids"].shape[1]
    return out.sequences[0, k:].tolist(), [s[0].float().clone() for s in out.logits]


def qwen2_vl_ref(model, tokenizer, image_processor, name: str, text: str, n: int, *,
                 images: list[tuple[int, int, int]] = (), videos: list[tuple[int, int, int, int]] = ()) -> MMRef:
    """images: (seed, h, w); videos: (seed, frames, h, w). Images come first in the message."""
    pngs = [image_bytes(s, h, w) for s, h, w in images]
    vids = [[image_bytes(s * 100 + i, h, w) for i in range(f)] for s, f, h, w in videos]
    content = [{"type": "image"}] * len(pngs) + [{"type": "video"}] * len(vids) + [{"type": "text", "text": text}]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    inputs: dict = {}
    merge = image_processor.merge_size ** 2
    if pngs:
        px = image_processor(images=[_rgb(p) for p in pngs], return_tensors="pt")
        inputs |= {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"]}
        for g in px["image_grid_thw"]:
            prompt = prompt.replace("<|image_pad|>", "<|placeholder|>" * (int(g.prod()) // merge), 1)
    if vids:
        rows, grids = zip(*(video_pixels(image_processor, [_rgb(f) for f in v]) for v in vids))
        inputs |= {"pixel_values_videos": torch.cat(rows), "video_grid_thw": torch.tensor(grids)}
        for g in grids:
            prompt = prompt.replace("<|video_pad|>", "<|vplaceholder|>" * (int(np.prod(g)) // merge), 1)
    prompt = prompt.replace("<|placeholder|>", "<|image_pad|>").replace("<|vplaceholder|>", "<|video_pad|>")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    types = torch.zeros_like(ids, dtype=torch.int)
    types[ids == model.config.image_token_id] = 1
    types[ids == model.config.video_token_id] = 2
    tokens, logits = _generate(model, inputs | {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                "mm_token_type_ids": types}, n)
    modality = "+".join(m for m, items in (("image", pngs), ("video", vids)) if items) or "text"
    packed = [pack_frames(v) for v in vids]
    return MMRef(name, ids[0].tolist(), modality, pngs + packed, tokens, logits, {"image": pngs, "video": packed})


def pcm(seed: int, seconds: float, rate: int = 16000) -> np.ndarray:
    """A seeded test clip: two tones and noise, float32 in [-1, 1]."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    wave = 0.4 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.2 * np.sin(2 * np.pi * 1234 * t)
    return (wave + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def qwen2_audio_ref(model, processor, name: str, text: str, n: int, clips: list[tuple[int, float]]) -> MMRef:
    """clips: (seed, seconds) at the feature extractor's rate."""
    rate = processor.feature_extractor.sampling_rate
    audio = [pcm(s, sec, rate) for s, sec in clips]
    content = [{"type": "audio"}] * len(audio) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    inputs = dict(processor(text=prompt, audio=audio or None, sampling_rate=rate, return_tensors="pt"))
    tokens, logits = _generate(model, inputs, n)
    raws = [a.astype("<f4").tobytes() for a in audio]
    return MMRef(name, inputs["input_ids"][0].tolist(), "audio" if audio else "text", raws, tokens, logits,
                 {"audio": raws})
