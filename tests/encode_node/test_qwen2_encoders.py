"""The Qwen2-VL (image, video) and Qwen2-Audio encoders: batched embeddings equal the full model's,
grids travel with them, the video patch layout is transformers' own, one bad item fails alone."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from media_factory import image_bytes
from PIL import Image

from coordinator.protocol.frames import pack_frames
from coordinator.protocol.models import QWEN2_AUDIO_DIR, QWEN2_VL_DIR
from encode_node.registry import make_encoder
from encode_node.video_patches import num_video_tokens, video_pixels


@pytest.fixture(scope="module")
def vl():
    torch.set_num_threads(2)
    return make_encoder(QWEN2_VL_DIR)


@pytest.fixture(scope="module")
def audio():
    return make_encoder(QWEN2_AUDIO_DIR)


@pytest.fixture(scope="module")
def full_vl():
    from transformers import Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration.from_pretrained(QWEN2_VL_DIR).eval()


def _rgb(raw: bytes) -> Image.Image:
    return Image.open(io.BytesIO(raw)).convert("RGB")


def test_only_the_vision_tower_is_kept(vl):
    assert vl.model.language_model is None and vl.modalities == {"image", "video"}


def test_batched_images_equal_the_full_model_per_image(vl, full_vl):
    media = [[image_bytes(1, 300, 200)], [image_bytes(2, 100, 100), image_bytes(3, 400, 300, "JPEG")]]
    batch = vl.encode(media, "image")
    assert batch.errors == [None, None]
    for got, raws, meta in zip(batch.per_request, media, batch.media):
        out = vl.image_processor(images=[_rgb(r) for r in raws], return_tensors="pt")
        with torch.inference_mode():
            want = torch.cat(full_vl.model.get_image_features(out["pixel_values"], out["image_grid_thw"]).pooler_output)
        assert (got - want).abs().max().item() < 1e-5
        assert [m.grid_thw for m in meta] == [tuple(g) for g in out["image_grid_thw"].tolist()]
        assert sum(m.num_tokens for m in meta) == got.shape[0]


def _hf_video_patchify(frames: torch.Tensor, patch: int, merge: int, tps: int) -> torch.Tensor:
    """transformers' Qwen2VLVideoProcessor.patchify (needs torchvision to import), copied verbatim."""
    batch, num_frames, channel, height, width = frames.shape
    if pad := -num_frames % tps:
        frames = torch.cat((frames, frames[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        num_frames += pad
    gt, gh, gw = num_frames // tps, height // patch, width // patch
    patches = frames.view(batch, gt, tps, channel, gh // merge, merge, patch, gw // merge, merge, patch)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(batch, gt * gh * gw, channel * tps * patch * patch)[0]


@pytest.mark.parametrize("num_frames", [1, 3, 4])
def test_video_pixels_have_the_video_processors_layout(vl, num_frames):
    ip = vl.image_processor
    # 112x84 is a multiple of 28 inside the pixel bounds: resizing keeps every pixel.
    raws = [np.random.default_rng(i).integers(0, 256, (84, 112, 3), dtype=np.uint8) for i in range(num_frames)]
    rows, grid = video_pixels(ip, [Image.fromarray(r) for r in raws])
    mean, std = np.array(ip.image_mean, np.float32), np.array(ip.image_std, np.float32)
    norm = np.stack([((r.astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1) for r in raws])
    want = _hf_video_patchify(torch.from_numpy(norm)[None], ip.patch_size, ip.merge_size, ip.temporal_patch_size)
    assert grid == ((num_frames + 1) // 2, 6, 8)
    assert rows.shape == want.shape and (rows - want).abs().max().item() < 1e-5
    assert num_video_tokens(ip, num_frames, 84, 112) == grid[0] * grid[1] * grid[2] // 4


def test_batched_videos_equal_the_full_model(vl, full_vl):
    videos = [[image_bytes(10 + i, 120, 160) for i in range(3)], [image_bytes(20 + i, 60, 90) for i in range(4)]]
    batch = vl.encode([[pack_frames(v)] for v in videos], "video")
    for got, frames, (meta,) in zip(batch.per_request, videos, batch.media):
        rows, grid = video_pixels(vl.image_processor, [_rgb(f) for f in frames])
        with torch.inference_mode():
            want = full_vl.model.get_video_features(rows, torch.tensor([grid])).pooler_output[0]
        assert meta.modality == "video" and meta.grid_thw == grid and meta.num_tokens == got.shape[0]
        assert (got - want).abs().max().item() < 1e-5


def test_a_bad_frame_fails_only_its_video(vl):
    good = pack_frames([image_bytes(1, 64, 64)] * 2)
    jpeg = image_bytes(2, 64, 64, "JPEG")
    mixed_sizes = pack_frames([image_bytes(3, 64, 64), image_bytes(3, 32, 64)])
    batch = vl.encode([[good], [pack_frames([jpeg[:100]])], [mixed_sizes], [good]], "video")
    assert batch.errors[0] is None and batch.errors[3] is None
    assert "could not be decoded" in batch.errors[1] and "one size" in batch.errors[2]
    assert torch.equal(batch.per_request[0], batch.per_request[3])


def test_audio_rows_match_the_processors_token_count_and_batch_alone(audio):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(QWEN2_AUDIO_DIR)
    clips = [np.random.default_rng(i).standard_normal(n).astype("<f4") * 0.1 for i, n in enumerate([16000, 41000, 800])]
    batch = audio.encode([[clips[0].tobytes()], [clips[1].tobytes(), clips[2].tobytes()]], "audio")
    alone = audio.encode([[clips[1].tobytes()]], "audio")
    inputs = processor(text=["<|AUDIO|>"] * 3, audio=clips, sampling_rate=16000)
    counts = [len(ids) for ids in inputs["input_ids"]]
    assert [m.num_tokens for ms in batch.media for m in ms] == counts
    assert (batch.per_request[1][: counts[1]] - alone.per_request[0]).abs().max().item() < 1e-5


def test_an_encoder_refuses_a_modality_it_lacks(audio):
    with pytest.raises(ValueError, match="not image"):
        audio.encode([[b"x"]], "image")
