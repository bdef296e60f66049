"""Exactness of the engine on Qwen2-VL (images, videos: M-RoPE) and Qwen2-Audio: embeddings from the
real encoders (encode_node), prompts and media batched with different lengths and sizes, tokens and
every step's logits equal to the model's own `generate()` on raw inputs, in a combined engine and
across a prefill -> decode hand-off (KV cache through the wire format, rope delta in the job).
Negative controls (swapped embeddings, a shifted grid, an off-by-one rope delta) must fail."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from logit_check import logit_mismatches
from mm_refs import MMRef, qwen2_audio_ref, qwen2_vl_ref

from coordinator.protocol.messages import DecodeJob, EncodedMedia, SamplingParams
from coordinator.protocol.models import QWEN2_AUDIO_DIR, QWEN2_VL_DIR
from encode_node.registry import make_encoder
from llm_node.architectures import load_model
from llm_node.engine import EngineConfig, EngineRequest, ReferenceEngine
from transport.wire import TensorDescriptor, describe, rebuild


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


@pytest.fixture(scope="module")
def vl() -> Arch:
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


@pytest.fixture(scope="module")
def audio() -> Arch:
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


@pytest.fixture(params=["vl", "audio"])
def arch(request) -> Arch:
    return request.getfixturevalue(request.param)


def _request(arch: Arch, ref: MMRef, **override) -> EngineRequest:
    emb, media = arch.embeds[ref.name]
    fields = {"prompt_token_ids": ref.prompt_ids, "mm_embeddings": emb, "media": media,
              "sampling": SamplingParams(max_tokens=len(ref.tokens), ignore_eos=True, return_logits=True)}
    return EngineRequest(request_id=ref.name, **fields | override)


def _engine(arch: Arch, role: str = "combined", **config) -> ReferenceEngine:
    return ReferenceEngine(arch.model, arch.tokenizer, EngineConfig(role=role, **config))


def _problems(arch: Arch, runs, refs=None) -> list[str]:
    return [p for r in refs or arch.refs
            for p in logit_mismatches(r.name, r.tokens, r.logits, runs[r.name].tokens, runs[r.name].logits)]


def test_references_are_varied(arch):
    """A model that repeats one token would make the comparison vacuous."""
    assert all(len(set(r.tokens)) > 2 for r in arch.refs)
    assert len({tuple(r.tokens) for r in arch.refs}) == len(arch.refs)


def test_combined_batched_matches_generate(arch, drive):
    refs = arch.refs
    schedule = {0: [_request(arch, refs[0]), _request(arch, refs[1])], 1: [_request(arch, refs[2])],
                3: [_request(arch, r) for r in refs[3:]]}
    runs = drive(_engine(arch), schedule)
    problems = _problems(arch, runs)
    assert not problems, "\n".join(problems)
    assert all(runs[r.name].finish_reason == "length" for r in refs)


def test_split_prefill_then_decode_matches_generate(arch, drive):
    first = drive(_engine(arch, "prefill"), {0: [_request(arch, r) for r in arch.refs]})
    schedule = {}
    for step, ref in enumerate(arch.refs):
        (out,) = first[ref.name].outputs
        desc, raw = describe(ref.name, "kv", out.handoff_kv)
        job = DecodeJob.model_validate_json(DecodeJob(
            request_id=ref.name, prompt_token_ids=ref.prompt_ids, sampling=SamplingParams(), arrival=0.0,
            output_token_ids=out.new_token_ids, kv=[desc], rope_delta=out.handoff_rope_delta).model_dump_json())
        kv = rebuild(TensorDescriptor.model_validate_json(job.kv[0].model_dump_json()), bytes(raw))
        schedule[step] = [_request(arch, ref, mm_embeddings=None, media=[], kv=kv, rope_delta=job.rope_delta,
                                   output_token_ids=list(out.new_token_ids))]
    second = drive(_engine(arch, "decode"), schedule)
    problems = [p for r in arch.refs for p in logit_mismatches(
        r.name, r.tokens, r.logits, first[r.name].tokens + second[r.name].tokens,
        first[r.name].logits + second[r.name].logits)]
    assert not problems, "\n".join(problems)


def test_qwen2_vl_rope_deltas_are_nonzero_for_media(vl, drive):
    (out,) = drive(_engine(vl, "prefill"), {0: [_request(vl, vl.refs[0])]})["one-image"].outputs
    assert out.handoff_rope_delta < 0  # 28 image tokens span only max(h, w)/2 positions


def _pair(arch: Arch, first: str | None = None, second: str | None = None) -> tuple[MMRef, MMRef]:
    by_name = {r.name: r for r in arch.refs}
    a, b = (by_name[first], by_name[second]) if first else (arch.refs[0], arch.refs[-1])
    ea, eb = arch.embeds[a.name][0], arch.embeds[b.name][0]
    assert a.prompt_ids == b.prompt_ids and ea.shape == eb.shape and not torch.equal(ea, eb)
    return a, b


def test_control_swapped_embeddings_fail(arch, drive):
    a, b = _pair(arch)
    swapped = [_request(arch, a, mm_embeddings=arch.embeds[b.name][0]),
               _request(arch, b, mm_embeddings=arch.embeds[a.name][0])]
    runs = drive(_engine(arch), {0: swapped})
    assert _problems(arch, runs, [a]) and _problems(arch, runs, [b])


def test_control_swapped_video_embeddings_fail(vl, drive):
    a, b = _pair(vl, "video", "same-size-video")
    swapped = [_request(vl, a, mm_embeddings=vl.embeds[b.name][0]), _request(vl, b, mm_embeddings=vl.embeds[a.name][0])]
    runs = drive(_engine(vl), {0: swapped})
    assert _problems(vl, runs, [a]) and _problems(vl, runs, [b])


@pytest.mark.parametrize("name", ["one-image", "video"])
def test_control_transposed_grid_fails(vl, drive, name):
    """Same tokens, same embeddings, the grid's height and width swapped: only the M-RoPE positions move."""
    ref = next(r for r in vl.refs if r.name == name)
    _, (item,) = vl.embeds[ref.name]
    t, h, w = item.grid_thw
    shifted = item.model_copy(update={"grid_thw": (t, w, h)})
    runs = drive(_engine(vl), {0: [_request(vl, ref, media=[shifted])]})
    assert any("logits" in p for p in _problems(vl, runs, [ref]))


def test_control_rope_delta_off_by_one_fails(vl, drive):
    ref = vl.refs[0]
    (out,) = drive(_engine(vl, "prefill"), {0: [_request(vl, ref)]})[ref.name].outputs
    req = _request(vl, ref, mm_embeddings=None, media=[], kv=out.handoff_kv, rope_delta=out.handoff_rope_delta + 1,
                   output_token_ids=list(out.new_token_ids))
    run = drive(_engine(vl, "decode"), {0: [req]})[ref.name]
    problems = logit_mismatches(ref.name, ref.tokens, ref.logits, out.new_token_ids + run.tokens,
                                out.logits + run.logits)
    assert any("logits" in p for p in problems)


def test_missing_or_wrong_metadata_is_refused(vl):
    engine = _engine(vl)
    ref = vl.refs[0]
    _, (item,) = vl.embeds[ref.name]
    with pytest.raises(ValueError, match="M-RoPE needs every item's grid_thw"):
        engine.add(_request(vl, ref, media=[]))
    with pytest.raises(ValueError, match="does not fill"):
        engine.add(_request(vl, ref, media=[item.model_copy(update={"grid_thw": (1, 4, 4)})]))
    assert not engine.has_unfinished()
