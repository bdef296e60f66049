"""Exactness of the engine on Qwen2-VL (images, videos: M-RoPE) and Qwen2-Audio: embeddings from the
real encoders (encode_node), prompts and media batched with different lengths and sizes, tokens and
every step's logits equal to the model's own `generate()` on raw inputs, in a combined engine and
across a prefill -> decode hand-off (KV cache through the wire format, rope delta in the job).
Negative controls (swapped embeddings, a shifted grid, an off-by-one rope delta) must fail."""

from __future__ import annotations

import pytest
import torch
from logit_check import logit_mismatches
from mm_refs import Arch, MMRef, audio_arch, vl_arch

from coordinator.protocol.messages import DecodeJob, SamplingParams
from llm_node.engine import EngineConfig, EngineRequest, ReferenceEngine
from transport.wire import TensorDescriptor, describe, rebuild


@pytest.fixture(scope="module")
def vl() -> Arch:
    return vl_arch()


@pytest.fixture(scope="module")
def audio() -> Arch:
    return audio_arch()


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


def test_resumed_run_continues_exactly(arch, drive):
    """A re-run after a worker died prefills the prompt plus the tokens already streamed; with M-RoPE the
    generated tokens' positions continue from the rope delta, so the rest matches generate()."""
    k = 2
    schedule = {0: [_request(arch, r, output_token_ids=r.tokens[:k]) for r in arch.refs]}
    runs = drive(_engine(arch), schedule)
    problems = [p for r in arch.refs for p in logit_mismatches(
        r.name, r.tokens, r.logits, r.tokens[:k] + runs[r.name].tokens, r.logits[:k] + runs[r.name].logits)]
    assert not problems, "\n".join(problems)
