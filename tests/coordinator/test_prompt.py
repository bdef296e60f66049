"""PromptBuilder must produce exactly the ids of `processor(text, images)`, and refuse bad requests clearly."""

from __future__ import annotations

import base64
import copy
import io

import pytest
from PIL import Image
from transformers import AutoProcessor

from coordinator.api.schema import ChatCompletionRequest
from coordinator.errors import RequestError
from coordinator.media import MediaError, MediaLimits
from coordinator.prompt import DEFAULT_MAX_TOKENS, PromptBuilder, sampling_from_request
from coordinator.protocol.models import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def processor():
    return AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def builder(processor) -> PromptBuilder:
    return PromptBuilder(processor)


def png(size=(40, 30), color=(10, 200, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def image_part(data: bytes | None = None) -> dict:
    url = "data:image/png;base64," + base64.b64encode(data or png()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def make_request(messages: list[dict], **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "tiny-llava", "messages": messages, **fields})


def to_template(messages: list[dict]) -> list[dict]:
    """What the processor's chat template expects: image parts as {"type": "image"}."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image"} if p["type"] == "image_url" else p for p in content]
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def build_error(builder: PromptBuilder, messages: list[dict], **fields) -> RequestError:
    with pytest.raises(RequestError) as exc:
        builder.build(make_request(messages, **fields))
    return exc.value


RED, BLUE = png((50, 20), (255, 0, 0)), png((300, 400), (0, 0, 255))
CASES = {
    "text only": [{"role": "user", "content": "Hello there"}],
    "one image": [{"role": "user", "content": [text("What is in "), image_part(RED), text(" this picture?")]}],
    "two images": [
        {"role": "user", "content": [image_part(RED), text("vs"), image_part(BLUE), text("which is bluer?")]}
    ],
    "image first, no text": [{"role": "user", "content": [image_part(BLUE)]}],
    "system message": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [text("Describe"), image_part(RED)]},
    ],
    "developer role": [{"role": "developer", "content": "Be nice."}, {"role": "user", "content": "hi"}],
    "multi-turn": [
        {"role": "system", "content": [text("Rules: none.")]},
        {"role": "user", "content": [image_part(RED), text("colour?")]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [text("and this one?"), image_part(BLUE)]},
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_ids_match_the_processor(builder, processor, name):
    messages = CASES[name]
    built = builder.build(make_request(messages))
    rendered = processor.apply_chat_template(to_template(messages), add_generation_prompt=True, tokenize=False)
    images = [Image.open(io.BytesIO(img.data)).convert("RGB") for img in built.images]
    expected = processor(text=rendered, images=images or None, return_tensors="pt").input_ids[0].tolist()
    assert built.prompt_token_ids == expected
    assert built.prompt_text == rendered
    assert built.num_image_tokens == 196 * len(images) == expected.count(processor.image_token_id)
    assert rendered.endswith("<|assistant|>\n")


def test_images_are_returned_in_prompt_order(builder):
    built = builder.build(make_request(CASES["multi-turn"]))
    assert [img.data for img in built.images] == [RED, BLUE]
    assert [(img.width, img.height) for img in built.images] == [(50, 20), (300, 400)]


def test_from_model_dir_reads_the_context_length():
    assert PromptBuilder.from_model_dir(DEFAULT_MODEL_DIR).max_model_len == 2048


# --- validation ------------------------------------------------------------------------------------


def test_empty_messages(builder):
    err = build_error(builder, [])
    assert (err.message, err.param, err.status) == ("messages must contain at least one message", "messages", 400)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "only rules"}],
        [{"role": "user", "content": "   "}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": [text("")]}],
        [{"role": "assistant", "content": "hi"}],
    ],
)
def test_no_user_content(builder, messages):
    err = build_error(builder, messages)
    assert (err.message, err.param) == ("messages must include a user message with text or an image", "messages")


def test_too_many_images_is_checked_before_loading_any(builder):
    bad = {"type": "image_url", "image_url": {"url": "not-a-url"}}
    err = build_error(builder, [{"role": "user", "content": [bad] * 5}])
    assert (err.message, err.param) == ("request has 5 images; the limit is 4 (--max-images-per-request)", "messages")


def test_image_limit_counts_all_messages(processor):
    builder = PromptBuilder(processor, MediaLimits(max_images_per_request=1))
    err = build_error(builder, CASES["multi-turn"])
    assert err.message.startswith("request has 2 images; the limit is 1")


def test_audio_is_refused(builder):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    err = build_error(builder, [{"role": "user", "content": [text("listen"), audio]}])
    assert err.message.startswith("audio encoder not configured")
    assert err.param == "messages[0].content[1]"


def test_video_is_refused(builder):
    err = build_error(builder, [{"role": "user", "content": [{"type": "video", "video": ["f1", "f2"]}]}])
    assert err.message == "video input is not supported by this model; send the frames as image_url parts"
    assert err.param == "messages[0].content[0]"


def test_images_only_in_user_messages(builder):
    err = build_error(builder, [{"role": "system", "content": [image_part()]}, {"role": "user", "content": "hi"}])
    assert err.message == "images are only accepted in user messages, not system"
    assert err.param == "messages[0].content[0]"


@pytest.mark.parametrize(
    "content,param",
    [("look: <image>", "messages[0].content"), ([text("ok"), text("<image>")], "messages[0].content[1].text")],
)
def test_literal_image_placeholder_in_text(builder, content, param):
    err = build_error(builder, [{"role": "user", "content": content}])
    assert (err.message, err.param) == ("text must not contain '<image>'; send images as image_url parts", param)


def test_media_errors_carry_the_part_path(builder):
    with pytest.raises(MediaError) as exc:
        remote = {"type": "image_url", "image_url": {"url": "http://a/b.png"}}
        builder.build(make_request([{"role": "user", "content": [text("x"), remote]}]))
    assert exc.value.param == "messages[0].content[1].image_url.url"
    assert exc.value.message.startswith("remote image URLs are not fetched")


@pytest.mark.parametrize("field,value", [("max_tokens", 0), ("max_tokens", -3), ("max_completion_tokens", 0)])
def test_max_tokens_must_be_positive(builder, field, value):
    err = build_error(builder, CASES["text only"], **{field: value})
    assert (err.message, err.param) == (f"{field} must be at least 1, got {value}", field)


def test_prompt_longer_than_the_context(processor):
    builder = PromptBuilder(processor, max_model_len=200)
    err = build_error(builder, CASES["one image"])
    assert err.param == "messages"
    assert err.message.startswith("prompt is 210 tokens (196 of them for 1 image); the model's context is 200 tokens")


def test_prompt_plus_max_tokens_longer_than_the_context(processor):
    builder = PromptBuilder(processor, max_model_len=215)
    assert len(builder.build(make_request(CASES["one image"], max_tokens=5)).prompt_token_ids) == 210
    err = build_error(builder, CASES["one image"], max_completion_tokens=6)
    assert err.param == "max_completion_tokens"
    assert err.message == (
        "prompt (210 tokens) + max_completion_tokens (6) exceeds the model's context of 215 tokens; "
        "set max_completion_tokens to at most 5"
    )


def test_without_max_tokens_the_budget_is_what_the_context_leaves(processor):
    """OpenAI and vLLM generate to EOS or the context's end when the request sets no max_tokens."""
    builder = PromptBuilder(processor, max_model_len=215)
    built = builder.build(make_request(CASES["one image"]))
    assert (len(built.prompt_token_ids), built.max_tokens) == (210, 5)
    assert builder.build(make_request(CASES["one image"], max_tokens=3)).max_tokens == 3
    assert builder.build(make_request(CASES["one image"], max_completion_tokens=4)).max_tokens == 4
    assert sampling_from_request(make_request(CASES["one image"]), default_max_tokens=built.max_tokens).max_tokens == 5
    assert sampling_from_request(make_request(CASES["one image"], max_tokens=2), default_max_tokens=5).max_tokens == 2
    builder.max_model_len = None  # neither the config nor the tokenizer states a context
    assert builder.build(make_request(CASES["text only"])).max_tokens == DEFAULT_MAX_TOKENS


def test_default_context_is_the_tokenizers(builder):
    assert builder.max_model_len == 2048
    err = build_error(builder, [{"role": "user", "content": "hello " * 2100}])
    assert err.param == "messages" and "the model's context is 2048 tokens" in err.message


def test_template_errors_become_request_errors(processor):
    strict = copy.deepcopy(processor)
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    err = build_error(PromptBuilder(strict), CASES["text only"])
    assert err.message == "the model's chat template rejected the messages: roles must alternate"
    assert err.param == "messages"


def test_processor_without_image_support_is_refused(processor):
    with pytest.raises(TypeError, match="need a LLaVA-style, Qwen2-VL or Qwen2-Audio processor"):
        PromptBuilder(processor.tokenizer)


# --- sampling --------------------------------------------------------------------------------------


def test_sampling_defaults():
    s = sampling_from_request(make_request(CASES["text only"]))
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop) == (16, 1.0, 1.0, None, ())
    assert sampling_from_request(make_request(CASES["text only"]), default_temperature=0.0).temperature == 0.0


def test_sampling_fields_are_mapped():
    fields = {"max_tokens": 9, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": "END",
              "ignore_eos": True}
    req = make_request(CASES["text only"], **fields)
    s = sampling_from_request(req)
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.ignore_eos) == (7, 0.5, 0.9, 3, ("END",), True)
    assert sampling_from_request(make_request(CASES["text only"])).ignore_eos is False
    assert sampling_from_request(make_request(CASES["text only"], max_tokens=9, stop=["a", "b"])).stop == ("a", "b")


def test_top_p_zero_means_greedy():
    s = sampling_from_request(make_request(CASES["text only"], temperature=0.8, top_p=0.0))
    assert (s.temperature, s.top_p) == (0.0, 1.0)


@pytest.mark.parametrize("n", [0, 2])
def test_only_one_choice(n):
    with pytest.raises(RequestError) as exc:
        sampling_from_request(make_request(CASES["text only"], n=n))
    assert exc.value.param == "n"
    assert exc.value.message == f"n={n} is not supported; this server returns exactly one choice (n=1)"


def test_empty_stop_string():
    with pytest.raises(RequestError) as exc:
        sampling_from_request(make_request(CASES["text only"], stop=["ok", ""]))
    assert (exc.value.message, exc.value.param) == ("stop strings must not be empty", "stop")
