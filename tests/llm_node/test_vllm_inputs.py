"""What the vLLM engine checks before vLLM sees a request, and the prompt it hands vLLM: on the real
checkpoints' configs (no vLLM needed). vLLM itself accepts a wrong row count and re-expands expanded
placeholders (measured), so these checks are what stands between a bad job and wrong output."""

from __future__ import annotations

import pytest
import torch

from coordinator.protocol.messages import EncodedMedia
from coordinator.protocol.models import DEFAULT_MODEL_DIR, QWEN2_AUDIO_DIR, QWEN2_VL_DIR
from llm_node.vllm_inputs import CheckpointSpec, check_request, collapsed_prompt, multi_modal_data


@pytest.fixture(scope="module")
def llava() -> CheckpointSpec:
    return CheckpointSpec.read(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def vl() -> CheckpointSpec:
    return CheckpointSpec.read(QWEN2_VL_DIR)


def _image(spec: CheckpointSpec, rows: int, grid=None) -> EncodedMedia:
    return EncodedMedia(modality="image", num_tokens=rows, grid_thw=grid)


def _token(spec: CheckpointSpec, modality: str) -> int:
    return next(t for t, m in spec.placeholders.items() if m == modality)


def test_specs_read_from_the_checkpoints(llava, vl):
    assert (llava.model_type, llava.hidden_size, llava.merge) == ("llava", 128, None)
    assert (vl.model_type, vl.merge) == ("qwen2_vl", 2) and set(vl.placeholders.values()) == {"image", "video"}
    assert "audio" in CheckpointSpec.read(QWEN2_AUDIO_DIR).placeholders.values()


def test_two_adjacent_llava_images_are_two_items_and_collapse_to_two_placeholders(llava):
    img = _token(llava, "image")
    prompt = [100, *[img] * 6, 101, 102]
    media = [_image(llava, 3), _image(llava, 3)]
    mm = torch.randn(6, llava.hidden_size)
    check_request(llava, "r", prompt, mm, media)
    assert collapsed_prompt(llava, prompt, media) == [100, img, img, 101, 102]
    data = multi_modal_data(llava, mm, media)
    assert data["image"].shape == (2, 3, llava.hidden_size)  # 3-D: n images, never a 2-D tensor (= n 1-row images)
    assert torch.equal(data["image"][1], mm[3:])


@pytest.mark.parametrize("case, match", [
    ("rows", "3 modality embedding rows"),
    ("hidden", r"must be \[n_tokens, 128\]"),
    ("vocab", "outside the vocabulary"),
    ("items", "does not match the prompt's placeholder tokens"),
    ("uncovered", "not covered by the media metadata"),
    ("nan", "NaN"),
])
def test_bad_requests_are_refused_with_a_reason(llava, case, match):
    img = _token(llava, "image")
    prompt, mm, media = [100, *[img] * 4, 101], torch.randn(4, llava.hidden_size), [_image(llava, 4)]
    if case == "rows":
        mm = mm[:3]
    elif case == "hidden":
        mm = torch.randn(4, 64)
    elif case == "vocab":
        prompt = [*prompt, 10**6]
    elif case == "items":
        media = [_image(llava, 3), _image(llava, 3)]
    elif case == "uncovered":
        media = [_image(llava, 2)]
        prompt = [100, *[img] * 2, 101, img, img]
    elif case == "nan":
        mm[1, 2] = float("nan")
    with pytest.raises(ValueError, match=match):
        check_request(llava, "r", prompt, mm, media)


def test_qwen2_vl_items_need_grids_that_make_their_token_count(vl):
    img, vid = _token(vl, "image"), _token(vl, "video")
    prompt = [100, *[img] * 6, 101, 102, *[vid] * 4, 103]
    media = [_image(vl, 6, (1, 4, 6)), EncodedMedia(modality="video", num_tokens=4, grid_thw=(2, 2, 4))]
    mm = torch.randn(10, vl.hidden_size)
    check_request(vl, "r", prompt, mm, media)
    data = multi_modal_data(vl, mm, media)
    assert data["image"]["image_grid_thw"].tolist() == [[1, 4, 6]] and data["video"]["video_embeds"].shape[0] == 4
    assert collapsed_prompt(vl, prompt, media) == [100, img, 101, 102, vid, 103]
    with pytest.raises(ValueError, match="makes 4 tokens, not 6"):
        check_request(vl, "r", prompt, mm, [_image(vl, 6, (1, 4, 4)), media[1]])
    with pytest.raises(ValueError, match="no grid_thw"):
        check_request(vl, "r", prompt, mm, [_image(vl, 6), media[1]])
    with pytest.raises(ValueError, match="does not match"):  # an image item where the prompt has video tokens
        check_request(vl, "r", prompt, mm, [media[0], _image(vl, 4, (1, 4, 4))])


def test_a_generated_placeholder_id_is_text_to_the_checks(llava):
    """A re-run's streamed tokens are text even when one is the image token (a random model samples it): the
    row count is the prompt's placeholders, and the decode engine may recompute such a token (only the prompt's
    own last placeholder, which it would recompute with a zero row, is refused). Ids still must be in range."""
    from llm_node.vllm_pd import decode_inputs

    img = _token(llava, "image")
    prompt, mm, media = [100, *[img] * 4, 101], torch.randn(4, llava.hidden_size), [_image(llava, 4)]
    check_request(llava, "r", prompt, mm, media, [7, img, 9])
    check_request(llava, "r", [100, 101], None, [], [img])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_request(llava, "r", prompt, mm, media, [img, 10**6])
    assert decode_inputs(llava, "r", prompt, [7, img, 9], media).shape == (4, llava.hidden_size)
    assert decode_inputs(llava, "r", [100, 101], [img, 9], []) is None
    with pytest.raises(ValueError, match="ends with a media placeholder"):
        decode_inputs(llava, "r", [100, *[img] * 4], [7], media)
