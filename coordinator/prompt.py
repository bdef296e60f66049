"""From an OpenAI chat request to the exact token ids the model's own processor would produce.

The coordinator tokenizes once, up front, so every later hop (encode, prefill, decode) works on ids,
and the prompt length is known before any GPU work is queued. Media (images, videos, audio clips) are
loaded, checked and counted here; the encoder later produces one embedding per placeholder token this
module inserted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.api.schema import ChatCompletionRequest, ImageURLPart, InputAudioPart, TextPart
from coordinator.errors import RequestError
from coordinator.media import ImageInput, MediaLimits
from coordinator.media_loading import MediaPayload, load_media
from coordinator.modalities import ProcessorView, load_processor
from coordinator.protocol.messages import SamplingParams
from coordinator.tokenizer_pool import TokenizerPool

DEFAULT_MAX_TOKENS = 16
"""The completion budget of a request that sets no max_tokens when the model's context length is unknown
(neither its config nor its tokenizer states one); with a known context it is what the prompt leaves."""
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
DEFAULT_MAX_PROMPT_CHARS = 1 << 20
"""--max-prompt-chars: the 1 MiB of text the request body limit allows beside media (api/chat.py body_limit);
~250k tokens of English, more than the contexts served here hold, and ~2 s to tokenize on one core."""
_NO_LIMIT = 10**7
"""transformers sets model_max_length to a huge sentinel when the tokenizer does not know it."""


@dataclass(frozen=True)
class BuiltPrompt:
    prompt_token_ids: list[int]
    """Template rendered, each media placeholder expanded to its tokens, tokenized."""
    images: list[ImageInput]
    """Validated images in prompt order; the n-th run of image tokens belongs to the n-th image."""
    num_image_tokens: int
    """Media placeholder tokens in prompt_token_ids, over all items (images, videos or audio)."""
    prompt_text: str
    """The rendered chat template before expansion (one placeholder per item), for logs."""
    media: list[MediaPayload] = field(default_factory=list)
    """Every media item in prompt order, all of one modality."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """The completion budget: the request's max_(completion_)tokens, or what the context leaves after the prompt."""


def sampling_from_request(req: ChatCompletionRequest, *, default_temperature: float = 1.0,
                          default_max_tokens: int = DEFAULT_MAX_TOKENS) -> SamplingParams:
    """Map OpenAI's sampling fields onto the engine's; `default_temperature` is used when absent
    (1.0 is OpenAI's default; 0 would make requests without a temperature greedy), `default_max_tokens`
    when neither max_tokens nor max_completion_tokens is set (BuiltPrompt.max_tokens: to the context's end)."""
    if req.n not in (None, 1):
        raise RequestError(f"n={req.n} is not supported; this server returns exactly one choice (n=1)", "n")
    name, max_tokens = "max_tokens", default_max_tokens
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
                          ignore_eos=req.ignore_eos, logprobs=req.logprobs_k())


def _describe(media: list[MediaPayload]) -> str:
    """"1 image", "2 audio clips"... ("" without media), for length errors."""
    if not media:
        return ""
    kind, n = media[0].modality, len(media)
    noun = {"image": "image", "video": "video", "audio": "audio clip"}[kind]
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _max_tokens_param(req: ChatCompletionRequest) -> str:
    return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"


class PromptBuilder:
    """Renders and tokenizes requests with one model's processor (chat template, tokenizer, media sizes).

    `max_model_len` bounds prompt + completion; by default the tokenizer's model_max_length. A request
    carries media of one modality (image, video or audio), which the model must take. `max_prompt_chars`
    bounds the client's text, checked before anything is rendered or tokenized.
    """

    def __init__(self, processor: Any, limits: MediaLimits | None = None, max_model_len: int | None = None,
                 max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS):
        self.view = ProcessorView(processor)
        self.processor = processor
        self.tokenizer = self.view.tokenizer
        self.image_token: str | None = self.view.placeholders.get("image")
        self.limits = limits or MediaLimits()
        if max_model_len is None:
            known = getattr(self.tokenizer, "model_max_length", None)
            max_model_len = known if isinstance(known, int) and known < _NO_LIMIT else None
        self.max_model_len = max_model_len
        self.max_prompt_chars = max_prompt_chars
        added = self.tokenizer.get_added_vocab()
        self._added: dict[str, int] = {tok: added[tok] for tok in self.view.placeholders.values() if tok in added}
        """Each placeholder that is one added token, and its id (PromptBuilder._tokenize)."""
        self._placeholder_ids = frozenset(self._added.values())
        # build() runs in worker threads, several at once: each tokenizes with its own copy.
        self.tokenizers = TokenizerPool(self.tokenizer)

    @classmethod
    def from_model_dir(cls, model_dir: Path | str, limits: MediaLimits | None = None,
                       max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS) -> PromptBuilder:
        """Processor and context length (text config's max_position_embeddings) from a checkpoint."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        max_pos = getattr(config.get_text_config(), "max_position_embeddings", None)
        return cls(load_processor(model_dir), limits, max_pos, max_prompt_chars)

    @property
    def modalities(self) -> list[str]:
        return list(self.view.placeholders)

    def build(self, req: ChatCompletionRequest) -> BuiltPrompt:
        """Validate `req`, load its media, and tokenize it exactly as the model's processor would."""
        sampling = sampling_from_request(req)
        self._check_text_size(req)
        messages, parts = self._template_messages(req)
        self._check_counts(parts)
        loaded = load_media(parts, self.limits, self.view)
        text = self._render(messages)
        tokens = {m: re.escape(t) for m, t in self.view.placeholders.items()}
        pieces = re.split(f"({'|'.join(tokens.values())})", text)
        spelled = pieces[1::2]
        if spelled != [self.view.placeholders[m] for m, *_ in parts]:  # text parts that only form it once joined
            raise RequestError(f"the text spells a media placeholder ({', '.join(self.view.placeholders.values())}); "
                               "remove it (media go in image_url, video or input_audio parts)", "messages")
        ids = self._tokenize(text, pieces, [(tok, item.num_tokens) for tok, item in zip(spelled, loaded.media)])
        n_media = sum(item.num_tokens for item in loaded.media)
        max_tokens = self._check_length(req, len(ids), n_media, _describe(loaded.media), sampling.max_tokens)
        return BuiltPrompt(prompt_token_ids=ids, images=loaded.images, num_image_tokens=n_media, prompt_text=text,
                           media=loaded.media, max_tokens=max_tokens)

    def _tokenize(self, text: str, pieces: list[str], runs: list[tuple[str, int]]) -> list[int]:
        """The ids of `text` with its n-th placeholder expanded to runs[n]'s count of it.

        A placeholder that is one added token of the tokenizer splits the text around it before anything else
        is tokenized, so the ids of the text as rendered, each placeholder id repeated, are those of the text
        expanded (tests/coordinator/test_prompt_expansion.py), without tokenizing thousands of placeholders
        (a Qwen2-VL video, a high-res image). Otherwise the expanded text is tokenized."""
        single = {tok: self._added.get(tok) for tok, _ in runs}
        with self.tokenizers.borrow() as tokenizer:
            if all(i is not None for i in single.values()):
                ids: list[int] = tokenizer(text)["input_ids"]
                out, n = [], iter(runs)
                for i in ids:
                    if i in self._placeholder_ids:
                        tok, count = next(n, ("", 0))
                        if single.get(tok) != i:
                            break  # not the order the text spells: take the slow path
                        out.extend([i] * count)
                    else:
                        out.append(i)
                else:
                    if next(n, None) is None:
                        return out
            expanded = pieces[0] + "".join(tok * count + after for (tok, count), after in zip(runs, pieces[2::2]))
            return tokenizer(expanded)["input_ids"]

    def _check_text_size(self, req: ChatCompletionRequest) -> None:
        """Refuse (413) more client text than --max-prompt-chars before it is rendered or tokenized: a
        tokenizer takes ~2 s a million characters, and a 45 MB body would hold a copy for over a minute."""
        chars = sum(len(m.content) if isinstance(m.content, str)
                    else sum(len(p.text) for p in m.content if isinstance(p, TextPart))
                    for m in req.messages if m.content is not None)
        if chars > self.max_prompt_chars:
            raise RequestError(f"messages hold {chars:,} characters of text; the limit is {self.max_prompt_chars:,} "
                               "(--max-prompt-chars); shorten the messages", "messages", status=413)

    def _check_counts(self, parts: list[tuple[str, Any, str]]) -> None:
        kinds = sorted({m for m, *_ in parts})
        if len(kinds) > 1:
            raise RequestError(f"request mixes {' and '.join(kinds)}; send one modality per request (an encoder "
                               "micro-batch holds one)", "messages")
        limits = {"image": (self.limits.max_images_per_request, "images", "--max-images-per-request"),
                  "video": (self.limits.max_videos_per_request, "videos", "--max-videos-per-request"),
                  "audio": (self.limits.max_audios_per_request, "audio clips", "--max-audios-per-request")}
        for kind in kinds:
            limit, what, flag = limits[kind]
            if len(parts) > limit:
                raise RequestError(f"request has {len(parts)} {what}; the limit is {limit} ({flag})", "messages")

    def _template_messages(self, req: ChatCompletionRequest) -> tuple[list[dict], list[tuple[str, Any, str]]]:
        """Messages in the chat template's form, and each media part's (modality, part, param) in prompt order."""
        if not req.messages:
            raise RequestError("messages must contain at least one message", "messages")
        out: list[dict] = []
        media: list[tuple[str, Any, str]] = []
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
                    continue
                kind = "image" if isinstance(part, ImageURLPart) else "audio" if isinstance(part, InputAudioPart) \
                    else "video"
                self._check_modality(kind, param)
                if role != "user":
                    what = {"image": "images", "video": "videos", "audio": "audio clips"}[kind]
                    raise RequestError(f"{what} are only accepted in user messages, not {msg.role}", param)
                media.append((kind, part, param))
                has_user_content = True
                parts.append({"type": kind})
            out.append({"role": role, "content": parts})
        if not has_user_content:
            what = "text or an image" if self.modalities == ["image"] else "text or media"
            raise RequestError(f"messages must include a user message with {what}", "messages")
        return out, media

    def _check_modality(self, kind: str, param: str) -> None:
        if kind in self.view.placeholders:
            return
        takes = " and ".join(self.modalities)
        if kind == "audio":
            raise RequestError(f"audio encoder not configured: this model takes {takes} input, so input_audio "
                               "parts cannot be answered; serve an audio model (e.g. Qwen2-Audio)", param)
        if kind == "video" and "image" in self.view.placeholders:
            raise RequestError("video input is not supported by this model; send the frames as image_url parts",
                               param)
        raise RequestError(f"{kind} input is not supported by this model; it takes {takes} input", param)

    def _check_text(self, text: str, param: str) -> None:
        # A literal placeholder in client text would be taken for media with nothing behind it.
        for kind, token in self.view.placeholders.items():
            if token in text:
                how = {"image": "images as image_url parts", "video": "videos as video parts",
                       "audio": "audio as input_audio parts"}[kind]
                raise RequestError(f"text must not contain {token!r}; send {how}", param)

    def _render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError

        try:
            return self.view.render(messages)
        except TemplateError as e:  # templates may raise_exception() on e.g. role order
            raise RequestError(f"the model's chat template rejected the messages: {e}", "messages") from None

    def _check_length(self, req: ChatCompletionRequest, n: int, n_media: int, items: str, max_tokens: int) -> int:
        """The completion budget (BuiltPrompt.max_tokens) of a prompt of `n` tokens, or a 400 if it does not fit."""
        limit = self.max_model_len
        if limit is None:
            return max_tokens
        detail = f" ({n_media} of them for {items})" if items else ""
        if n >= limit:
            raise RequestError(
                f"prompt is {n} tokens{detail}; the model's context is {limit} tokens, "
                "including at least one completion token; shorten the messages",
                "messages",
            )
        if req.max_tokens is None and req.max_completion_tokens is None:
            return limit - n
        if n + max_tokens > limit:
            raise RequestError(
                f"prompt ({n} tokens) + {_max_tokens_param(req)} ({max_tokens}) exceeds the model's context of "
                f"{limit} tokens; set {_max_tokens_param(req)} to at most {limit - n}",
                _max_tokens_param(req),
            )
        return max_tokens
