"""The encode node's encoder: the real vision tower + projector, batched, one bad image failing alone."""

from __future__ import annotations

import io

import pytest
import torch
from media_factory import image_bytes
from PIL import Image

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from encode_node.encoder import LlavaImageEncoder


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(2)
    return LlavaImageEncoder(DEFAULT_MODEL_DIR)


def test_language_model_is_not_kept(encoder):
    assert encoder.model.language_model is None
    assert sum(p.numel() for p in encoder.model.parameters()) < 500_000


def test_batched_embeddings_equal_the_full_model_perimage_bytes(encoder):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    full = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval()
    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)
    media = [[image_bytes(1, 300, 200, "PNG")], [image_bytes(2, 224, 400, "JPEG"), image_bytes(3, 100, 100, "PNG")]]
    batch = encoder.encode(media)
    assert batch.errors == [None, None]
    assert [t.shape for t in batch.per_request] == [(196, 128), (392, 128)]
    for got, raws in zip(batch.per_request, media):
        images = [Image.open(io.BytesIO(r)).convert("RGB") for r in raws]
        with torch.inference_mode():
            pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
            want = torch.cat(list(full.model.get_image_features(pixel_values=pixels).pooler_output))
        assert (got - want).abs().max().item() < 1e-5


def test_a_truncated_jpeg_fails_only_its_request(encoder):
    good = image_bytes(4, 128, 128, "PNG")
    jpeg = image_bytes(5, 256, 256, "JPEG")
    batch = encoder.encode([[good], [jpeg[: len(jpeg) // 2]], [good]])
    assert batch.per_request[1] is None and "could not be decoded" in batch.errors[1]
    assert batch.errors[0] is None and batch.errors[2] is None
    assert torch.equal(batch.per_request[0], batch.per_request[2])
