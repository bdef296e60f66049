"""Qwen2-VL video pixels from a list of frames, with the image processor (no torchvision).

transformers' Qwen2VLVideoProcessor needs torchvision; this builds the same `pixel_values_videos`
layout from the PIL image processor instead: every frame is resized (the image processor's
smart_resize and pixel bounds), rescaled and normalised exactly as an image, then consecutive frames
are paired into temporal patches of `temporal_patch_size` (an odd count repeats the last frame, as
the video processor does). A row of an image patch holds its frame `temporal_patch_size` times; a
row of a video patch holds the frames of its pair instead, in the same (C, t, ph, pw) order, and the
rows of temporal group g follow those of group g-1.
"""

from __future__ import annotations

import math

import torch
from PIL import Image


def num_video_tokens(image_processor, num_frames: int, height: int, width: int) -> int:
    """Placeholder tokens of a video: temporal groups x merged patches per frame."""
    groups = math.ceil(num_frames / image_processor.temporal_patch_size)
    return groups * image_processor.get_number_of_image_patches(height, width, {}) // image_processor.merge_size**2


def video_pixels(image_processor, frames: list[Image.Image]) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(`pixel_values_videos` rows of one video [t*h*w, C*tps*p*p], its grid (t, h, w))."""
    if not frames:
        raise ValueError("a video needs at least one frame")
    if len({f.size for f in frames}) != 1:
        raise ValueError(f"all frames of a video must have one size, got {sorted({f.size for f in frames})}")
    tps, p = image_processor.temporal_patch_size, image_processor.patch_size
    frames = frames + [frames[-1]] * (-len(frames) % tps)
    out = image_processor(images=frames, return_tensors="pt")
    pixels, grids = out["pixel_values"], out["image_grid_thw"]
    _, gh, gw = (int(v) for v in grids[0])
    n = gh * gw
    per_frame = pixels.view(len(frames), n, -1, tps, p, p)[:, :, :, 0]  # the copies along t are equal
    groups = per_frame.view(len(frames) // tps, tps, n, -1, p, p)  # [g, t, n, C, p, p]
    rows = groups.permute(0, 2, 3, 1, 4, 5).reshape(len(frames) // tps * n, -1)
    return rows.contiguous(), (len(frames) // tps, gh, gw)
