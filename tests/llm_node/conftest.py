"""Shared factories for the LLM-node tests: the tiny LLaVA loaded once, reference runs of
`model.generate()`, engines, a driver that feeds requests in at chosen steps, and the one
comparator that both the exactness tests and their negative controls use."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from coordinator.protocol.messages import SamplingParams
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from llm_node.engine import EngineConfig, EngineRequest, ReferenceEngine, StepOutput
from logit_check import logit_mismatches


@dataclass
class Case:
    """One prompt (with 0..n random images) and what `model.generate()` made of it."""

    name: str
    prompt_ids: list[int]
    mm_embeddings: torch.Tensor | None
    """Image embeddings from get_image_features, computed apart from the LLM path (as an encoder would)."""
    ref_tokens: list[int]
    ref_logits: list[torch.Tensor]
    inputs: dict = field(default_factory=dict)
    """What the processor made for generate() (input_ids, pixel_values...)."""


@dataclass
class Run:
    """What an engine produced for one request, gathered over steps."""

    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    outputs: list[StepOutput] = field(default_factory=list)


@pytest.fixture(scope="session")
def tiny():
    """(model, processor) of the embedded tiny LLaVA, loaded once."""
    import transformers
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(2)
    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)
    model = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval()
    return model, processor


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1].tokenizer


@pytest.fixture(scope="session")
def make_case(tiny):
    """Build a Case: chat-templated prompt, seeded random images of the given sizes, greedy reference."""
    model, processor = tiny

    def build(name: str, text: str, image_sizes: list[tuple[int, int]], max_tokens: int, seed: int = 0) -> Case:
        rng = np.random.default_rng(seed)
        from PIL import Image

        images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in image_sizes]
        content = [{"type": "image"}] * len(images) + [{"type": "text", "text": text}]
        prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        inputs = processor(text=prompt, images=images or None, return_tensors="pt")
        with torch.inference_mode():
            ref = model.generate(
                **inputs, max_new_tokens=max_tokens, do_sample=False, output_logits=True,
                return_dict_in_generate=True, eos_token_id=None,
            )
            mm = None
            if images:
                features = model.model.get_image_features(pixel_values=inputs["pixel_values"])
                mm = torch.cat(list(features.pooler_output)).clone()
        n_prompt = inputs["input_ids"].shape[1]
        return Case(
            name=name,
            prompt_ids=inputs["input_ids"][0].tolist(),
            mm_embeddings=mm,
            ref_tokens=ref.sequences[0, n_prompt:].tolist(),
            ref_logits=[step[0].float().clone() for step in ref.logits],
            inputs=dict(inputs),
        )

    return build


@pytest.fixture(scope="session")
def cases(make_case) -> list[Case]:
    """Prompts of different lengths: one, none and two images, different max_tokens."""
    return [
        make_case("one-image", "describe the image", [(300, 200)], 8, seed=1),
        make_case("text-only", "what is this", [], 5, seed=2),
        make_case("two-images", "tell me about the two pictures please", [(224, 400), (512, 256)], 12, seed=3),
        make_case(
            "one-image-long-text", "what color is the sky in this photo and what is at the left", [(480, 640)], 10,
            seed=4,
        ),
    ]


@pytest.fixture
def make_engine(tiny):
    def build(role: str = "combined", **config) -> ReferenceEngine:
        model, processor = tiny
        return ReferenceEngine(model, processor.tokenizer, EngineConfig(role=role, **config))

    return build


@pytest.fixture
def greedy():
    """SamplingParams for exactness runs: greedy, never stopping at eos, logits attached."""

    def build(max_tokens: int, **kw) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, return_logits=True, **kw)

    return build


@pytest.fixture
def case_request(greedy):
    """EngineRequest for a Case, optionally with other prompt ids or embeddings (negative controls)."""

    def build(case: Case, request_id: str | None = None, **override) -> EngineRequest:
        fields = {"prompt_token_ids": case.prompt_ids, "mm_embeddings": case.mm_embeddings,
                  "sampling": greedy(len(case.ref_tokens))}
        fields.update(override)
        return EngineRequest(request_id=request_id or case.name, **fields)

    return build


@pytest.fixture
def drive():
    """Step an engine to completion, adding requests at the steps given; returns a Run per request."""

    def run(engine: ReferenceEngine, schedule: dict[int, list[EngineRequest]], max_steps: int = 500) -> dict[str, Run]:
        runs: dict[str, Run] = {}
        step = 0
        while step <= max(schedule, default=0) or engine.has_unfinished():
            for req in schedule.get(step, []):
                engine.add(req)
                runs[req.request_id] = Run()
            for out in engine.step():
                r = runs[out.request_id]
                r.outputs.append(out)
                r.tokens += out.new_token_ids
                r.logits += out.logits
                r.text += out.new_text
                r.finish_reason = out.finish_reason or r.finish_reason
            step += 1
            assert step < max_steps, "engine did not finish"
        return runs

    return run


def mismatches(case: Case, tokens: list[int], logits: list[torch.Tensor], atol: float = 1e-4) -> list[str]:
    """Every way `tokens`/`logits` differ from the case's generate() reference; [] when they match."""
    return logit_mismatches(case.name, case.ref_tokens, case.ref_logits, tokens, logits, atol)


@pytest.fixture
def compare():
    """The comparator (see `mismatches`) as a fixture, so test modules need not import conftest."""
    return mismatches
