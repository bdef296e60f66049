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
from coordinator.protocol.messages import EncodedMedia
from coordinator.protocol.models import QWEN2_AUDIO_DIR, QWEN2_VL_DIR
from encode_node.registry import make_encoder
from encode_node.video_patches import video_pixels
from llm_node.architectures import load_model


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


@dataclass
class Arch:
    model: object
    tokenizer: object
    refs: list[MMRef]
    embeds: dict[str, tuple[torch.Tensor | None, list[EncodedMedia]]]


def _encode(encoder, ref: MMRef) -> tuple[torch.Tensor | None, list[EncodedMedia]]:
    """Embeddings the way an encode worker makes them (one modality per encoder call)."""
    rows, media = [], []
    for modality in ("image", "video", "audio"):
        items = ref.raw.get(modality) or []
        if items:
            batch = encoder.encode([items], modality)
            assert batch.errors == [None]
            rows.append(batch.per_request[0])
            media += batch.media[0]
    return (torch.cat(rows) if rows else None), media


def vl_arch() -> Arch:
    """Tiny Qwen2-VL, its generate() references (images, videos, both, text) and the encoder's embeddings."""
    from transformers import AutoImageProcessor, AutoTokenizer

    torch.set_num_threads(2)
    model, tok = load_model(QWEN2_VL_DIR), AutoTokenizer.from_pretrained(QWEN2_VL_DIR)
    ip = AutoImageProcessor.from_pretrained(QWEN2_VL_DIR)
    refs = [
        qwen2_vl_ref(model, tok, ip, "one-image", "describe the image", 8, images=[(1, 300, 200)]),
        qwen2_vl_ref(model, tok, ip, "two-images", "tell me about the two pictures please", 10,
                     images=[(2, 224, 400), (3, 100, 100)]),
        qwen2_vl_ref(model, tok, ip, "video", "what happens", 9, videos=[(4, 3, 120, 160)]),
        qwen2_vl_ref(model, tok, ip, "text-only", "what is this", 5),
        qwen2_vl_ref(model, tok, ip, "image-and-video", "compare the picture with the video at the left", 7,
                     images=[(5, 90, 150)], videos=[(6, 4, 60, 90)]),
        qwen2_vl_ref(model, tok, ip, "same-size-video", "what happens", 9, videos=[(8, 3, 120, 160)]),
        qwen2_vl_ref(model, tok, ip, "same-size-image", "describe the image", 8, images=[(7, 300, 200)]),
    ]
    encoder = make_encoder(QWEN2_VL_DIR)
    return Arch(model, tok, refs, {r.name: _encode(encoder, r) for r in refs})


def audio_arch() -> Arch:
    """Tiny Qwen2-Audio, its generate() references and the encoder's embeddings."""
    from transformers import AutoProcessor

    model, processor = load_model(QWEN2_AUDIO_DIR), AutoProcessor.from_pretrained(QWEN2_AUDIO_DIR)
    refs = [
        qwen2_audio_ref(model, processor, "one-second", "what is this sound", 8, [(1, 1.0)]),
        qwen2_audio_ref(model, processor, "two-clips", "compare the two sounds please", 10, [(2, 2.56), (3, 0.3)]),
        qwen2_audio_ref(model, processor, "text-only", "what is this", 5, []),
        qwen2_audio_ref(model, processor, "long-clip", "describe", 7, [(4, 4.9)]),
        qwen2_audio_ref(model, processor, "same-length", "what is this sound", 8, [(5, 1.0)]),
    ]
    encoder = make_encoder(QWEN2_AUDIO_DIR)
    return Arch(model, processor.tokenizer, refs, {r.name: _encode(encoder, r) for r in refs})


def llava_ref(model, processor, name: str, text: str, sizes: list[tuple[int, int]], n: int, seed: int) -> MMRef:
    """The tiny LLaVA's generate() on a chat prompt with PNG images of the given (h, w) sizes."""
    pngs = [image_bytes(seed + i, h, w) for i, (h, w) in enumerate(sizes)]
    content = [{"type": "image"}] * len(pngs) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(text=prompt, images=[_rgb(p) for p in pngs] or None, return_tensors="pt")
    tokens, logits = _generate(model, inputs, n)
    return MMRef(name, inputs["input_ids"][0].tolist(), "image" if pngs else "text", pngs, tokens, logits)
