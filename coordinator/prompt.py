"""From an OpenAI chat request to the exact token ids the model's own processor would produce.

The coordinator tokenizes once, up front, so every later hop (encode, prefill, decode) works on ids,
and the prompt length is known before any GPU work is queued. Images are counted, loaded and checked
here; the encoder later produces one embedding per image token this module inserted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.api.schema import ChatCompletionRequest, ImageURLPart, InputAudioPart, TextPart, VideoPart
from coordinator.errors import RequestError
from coordinator.media import ImageInput, MediaLimits, load_image
from coordinator.protocol.messages import SamplingParams

DEFAULT_MAX_TOKENS = 16
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
_NO_LIMIT = 10**7
"""transformers sets model_max_length to a huge sentinel when the tokenizer does not know it."""


@dataclass(frozen=True)
class BuiltPrompt:
    prompt_token_ids: list[int]
    """Template rendered, each image placeholder expanded to its image tokens, tokenized."""
    images: list[ImageInput]
    """Validated images in prompt order; the n-th run of image tokens belongs to the n-th image."""
    num_image_tokens: int
    """Image tokens in prompt_token_ids, over all images."""
    prompt_text: str
    """The rendered chat template before expansion (one placeholder per image), for logs."""


def sampling_from_request(req: ChatCompletionRequest, *, default_temperature: float = 1.0) -> SamplingParams:
    """Map OpenAI's sampling fields onto the engine's; `default_temperature` is used when absent
    (1.0 is OpenAI's default; 0 would make requests without a temperature greedy)."""
    if req.n not in (None, 1):
        raise RequestError(f"n={req.n} is not supported; this server returns exactly one choice (n=1)", "n")
    name, max_tokens = "max_tokens", DEFAULT_MAX_TOKENS
    if req.max_completion_tokens is not None:
        name, max_tokens = "max_completion_tokens", req.max_completion_tokens
    elif req.max_tokens is not None:
        max_tokens = req.max_tokens
    if max_tokens <= 0:
        raise RequestError(f"{name} must be at least 1, got {max_tokens}", name)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if any(s == "" for s in stop):
        raise RequestError("stop strings must not be empty", "stop")
    # Every stop string is matched against the output at every token, so their number and size are bounded.
    if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise RequestError(f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters",
                           "stop")
    temperature = default_temperature if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0.0:  # the limit of top_p -> 0 keeps only the most likely token
        temperature, top_p = 0.0, 1.0
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=req.seed, stop=stop,
                          ignore_eos=req.ignore_eos)


def _max_tokens_param(req: ChatCompletionRequest) -> str:
    return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"


class PromptBuilder:
    """Renders and tokenizes requests with one model's processor (chat template, tokenizer, image size).

    `max_model_len` bounds prompt + completion; by default the tokenizer's model_max_length.
    """

    def __init__(self, processor: Any, limits: MediaLimits | None = None, max_model_len: int | None = None):
        if not hasattr(processor, "_get_num_multimodal_tokens") or not getattr(processor, "image_token", None):
            name = type(processor).__name__
            raise TypeError(f"{name} cannot say how many tokens an image takes; need a LLaVA-style processor")
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token: str = processor.image_token
        self.limits = limits or MediaLimits()
        if max_model_len is None:
            known = getattr(self.tokenizer, "model_max_length", None)
            max_model_len = known if isinstance(known, int) and known < _NO_LIMIT else None
        self.max_model_len = max_model_len
        # build() runs in worker threads; a shared fast tokenizer can fail with "Already borrowed".
        self._tokenizer_lock = threading.Lock()

    @classmethod
    def from_model_dir(cls, model_dir: Path | str, limits: MediaLimits | None = None) -> PromptBuilder:
        """Processor and context length (text config's max_position_embeddings) from a checkpoint."""
        from transformers import AutoConfig, AutoProcessor

        config = AutoConfig.from_pretrained(model_dir)
        max_pos = getattr(config.get_text_config(), "max_position_embeddings", None)
        return cls(AutoProcessor.from_pretrained(model_dir), limits, max_pos)

    def build(self, req: ChatCompletionRequest) -> BuiltPrompt:
        """Validate `req`, load its images, and tokenize it exactly as `processor(text, images)` would."""
        sampling = sampling_from_request(req)
        messages, image_urls = self._template_messages(req)
        if len(image_urls) > self.limits.max_images_per_request:
            raise RequestError(
                f"request has {len(image_urls)} images; the limit is "
                f"{self.limits.max_images_per_request} (--max-images-per-request)",
                "messages",
            )
        images = [load_image(url, self.limits, param) for url, param in image_urls]
        text = self._render(messages)
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):  # text parts that only form the placeholder once joined
            raise RequestError(f"the text spells the image placeholder {self.image_token!r}; "
                               "remove it (images go in image_url parts)", "messages")
        counts = self._image_token_counts(images)
        expanded = pieces[0] + "".join(self.image_token * n + p for n, p in zip(counts, pieces[1:]))
        with self._tokenizer_lock:
            ids: list[int] = self.tokenizer(expanded)["input_ids"]
        self._check_length(req, len(ids), sum(counts), len(images), sampling.max_tokens)
        return BuiltPrompt(prompt_token_ids=ids, images=images, num_image_tokens=sum(counts), prompt_text=text)

    def _template_messages(self, req: ChatCompletionRequest) -> tuple[list[dict], list[tuple[str, str]]]:
        """Messages in the chat template's form, and each image's (url, param) in prompt order."""
        if not req.messages:
            raise RequestError("messages must contain at least one message", "messages")
        out: list[dict] = []
        images: list[tuple[str, str]] = []
        has_user_content = False
        for i, msg in enumerate(req.messages):
            where = f"messages[{i}].content"
            role = "system" if msg.role == "developer" else msg.role
            if msg.content is None or isinstance(msg.content, str):
                content: str | list[dict] = msg.content or ""
                self._check_text(content, where)
                has_user_content |= role == "user" and bool(content.strip())
                out.append({"role": role, "content": content})
                continue
            parts: list[dict] = []
            for j, part in enumerate(msg.content):
                param = f"{where}[{j}]"
                if isinstance(part, TextPart):
                    self._check_text(part.text, f"{param}.text")
                    has_user_content |= role == "user" and bool(part.text.strip())
                    parts.append({"type": "text", "text": part.text})
                elif isinstance(part, ImageURLPart):
                    if role != "user":
                        raise RequestError(f"images are only accepted in user messages, not {msg.role}", param)
                    images.append((part.image_url.url, f"{param}.image_url.url"))
                    has_user_content = True
                    parts.append({"type": "image"})
                elif isinstance(part, InputAudioPart):
                    raise RequestError("audio encoder not configured: this deployment serves no audio "
                                       "encoder yet, so input_audio parts cannot be answered", param)
                elif isinstance(part, VideoPart):
                    raise RequestError("video input is not supported yet; send the frames as image_url parts", param)
            out.append({"role": role, "content": parts})
        if not has_user_content:
            raise RequestError("messages must include a user message with text or an image", "messages")
        return out, images

    def _check_text(self, text: str, param: str) -> None:
        # A literal placeholder in client text would be taken for an image with no pixels behind it.
        if self.image_token in text:
            raise RequestError(f"text must not contain {self.image_token!r}; send images as image_url parts", param)

    def _render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError

        try:
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as e:  # templates may raise_exception() on e.g. role order
            raise RequestError(f"the model's chat template rejected the messages: {e}", "messages") from None

    def _image_token_counts(self, images: list[ImageInput]) -> list[int]:
        if not images:
            return []
        sizes = [(im.height, im.width) for im in images]
        return list(self.processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens)

    def _check_length(self, req: ChatCompletionRequest, n: int, n_img: int, images: int, max_tokens: int) -> None:
        limit = self.max_model_len
        if limit is None:
            return
        detail = f" ({n_img} of them for {images} image{'s' if images != 1 else ''})" if images else ""
        if n >= limit:
            raise RequestError(
                f"prompt is {n} tokens{detail}; the model's context is {limit} tokens, "
                "including at least one completion token; shorten the messages",
                "messages",
            )
        if n + max_tokens > limit:
            raise RequestError(
                f"prompt ({n} tokens) + {_max_tokens_param(req)} ({max_tokens}) exceeds the model's context of "
                f"{limit} tokens; set {_max_tokens_param(req)} to at most {limit - n}",
                _max_tokens_param(req),
            )
