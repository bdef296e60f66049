"""A re-run resumes after the tokens already streamed (exactly as the first run would have gone on), ids
off the wire are range-checked, broken tensors are refused, and a request that breaks a step fails alone."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("k", [1, 3])
def test_combined_resume_continues_exactly(cases, make_engine, case_request, drive, compare, k):
    """Resuming with the first k reference tokens yields the rest of generate()'s tokens and logits."""
    engine = make_engine()
    reqs = [case_request(c, output_token_ids=c.ref_tokens[:k]) for c in cases]
    runs = drive(engine, {0: reqs[:2], 1: reqs[2:]})
    for c in cases:
        run = runs[c.name]
        assert run.tokens == c.ref_tokens[k:], c.name
        problems = compare(c, c.ref_tokens[:k] + run.tokens, c.ref_logits[:k] + run.logits)
        assert not problems, "\n".join(problems)
        assert run.finish_reason == "length"


def test_a_streamed_placeholder_id_is_resumed_as_text(tiny, cases, make_engine, case_request):
    """A model can sample a media placeholder id (a tiny random one often does). generate() embeds a generated
    token as text, whatever its id; a re-run carrying one must too, not count it as a placeholder that lacks an
    embedding row (it was refused so). Reference: the model's own forward, the prompt with its pixels, then
    the streamed tokens fed one at a time on its cache."""
    model, case = tiny[0], cases[0]
    streamed = [case.ref_tokens[0], model.config.image_token_id]
    with torch.inference_mode():
        out = model(**case.inputs, use_cache=True)
        for token in streamed:
            out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    want = out.logits[0, -1].float()
    for role in ("combined", "prefill"):
        engine = make_engine(role)
        engine.add(case_request(case, output_token_ids=streamed))
        (first,) = engine.step()
        assert first.error is None, first.error
        assert first.new_token_ids == [int(want.argmax())], role
        assert torch.allclose(first.logits[0], want, atol=1e-4), (role, (first.logits[0] - want).abs().max())


def test_resume_text_continues_where_the_stream_left_off(cases, make_engine, case_request, drive):
    case = cases[2]
    whole = drive(make_engine(), {0: [case_request(case)]})[case.name].text
    first = drive(make_engine(), {0: [case_request(case, sampling=case_request(case).sampling.model_copy(
        update={"max_tokens": 4}))]})[case.name].text
    rest = drive(make_engine(), {0: [case_request(case, output_token_ids=case.ref_tokens[:4])]})[case.name].text
    assert first + rest == whole


def test_resume_with_other_tokens_diverges(cases, make_engine, case_request, drive, compare):
    """Negative control: continuing after tokens the model did not produce does not give its output."""
    case = cases[0]
    wrong = [(t + 1) % 1000 for t in case.ref_tokens[:3]]
    run = drive(make_engine(), {0: [case_request(case, output_token_ids=wrong)]})[case.name]
    assert compare(case, case.ref_tokens[:3] + run.tokens, case.ref_logits[:3] + run.logits)


def test_prefill_role_resume_hands_every_token_on(cases, make_engine, case_request, drive, compare):
    """A resumed prefill hands off all tokens so far; the decode engine finishes the request exactly."""
    case, k = cases[3], 2
    prefill = make_engine("prefill")
    prefill.add(case_request(case, output_token_ids=case.ref_tokens[:k]))
    (out,) = prefill.step()
    assert out.handoff_kv is not None and out.handoff_output_ids == case.ref_tokens[: k + 1]
    decode_req = case_request(case, mm_embeddings=None, kv=out.handoff_kv, output_token_ids=out.handoff_output_ids)
    run = drive(make_engine("decode"), {0: [decode_req]})[case.name]
    tokens = out.handoff_output_ids + run.tokens
    problems = compare(case, tokens, case.ref_logits[:k] + out.logits + run.logits)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("bad", [-1, 10**9])
def test_token_ids_outside_the_vocabulary_are_refused(cases, make_engine, case_request, bad):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        make_engine().add(case_request(cases[1], prompt_token_ids=[*cases[1].prompt_ids, bad]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        make_engine().add(case_request(cases[1], output_token_ids=[bad]))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_embeddings_and_kv_are_refused(cases, make_engine, case_request, value):
    emb = cases[0].mm_embeddings.clone()
    emb[3, 5] = value
    with pytest.raises(ValueError, match="NaN or infinite"):
        make_engine().add(case_request(cases[0], mm_embeddings=emb))
    prefill = make_engine("prefill")
    prefill.add(case_request(cases[0]))
    (out,) = prefill.step()
    kv = out.handoff_kv.clone()
    kv[0, 0, 0, 1, 0] = value
    with pytest.raises(ValueError, match="NaN or infinite"):
        make_engine("decode").add(case_request(cases[0], mm_embeddings=None, kv=kv,
                                               output_token_ids=out.handoff_output_ids))


def test_resume_past_max_tokens_is_refused(cases, make_engine, case_request):
    case = cases[1]
    with pytest.raises(ValueError, match="already reach max_tokens"):
        make_engine().add(case_request(case, output_token_ids=case.ref_tokens))


def test_a_request_that_breaks_a_step_fails_alone(cases, make_engine, case_request, drive, compare, monkeypatch):
    """The engine's forward raising for one sequence (a fault no valid input produces any more, so it is
    injected: a poison token in the prompt makes the real prefill raise) fails that request only; the
    others in the same steps finish exactly."""
    engine = make_engine()
    poison = cases[1].prompt_ids[-1]
    real_prefill = engine.runner.prefill

    def prefill(prompts, *args, **kwargs):
        if any(p[-1] == poison and len(p) == len(cases[1].prompt_ids) + 1 for p in prompts):
            raise RuntimeError("kernel failure on this input")
        return real_prefill(prompts, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "prefill", prefill)
    bad = case_request(cases[1], "bad", prompt_token_ids=[*cases[1].prompt_ids, poison])
    runs = drive(engine, {0: [case_request(cases[0]), bad], 2: [case_request(cases[2])]})
    assert runs["bad"].finish_reason == "error" and runs["bad"].tokens == []
    assert "kernel failure" in runs["bad"].outputs[-1].error
    for c in (cases[0], cases[2]):
        problems = compare(c, runs[c.name].tokens, runs[c.name].logits)
        assert not problems, "\n".join(problems)


def test_a_failure_only_the_batch_shows_fails_only_that_step(cases, make_engine, case_request, monkeypatch):
    engine = make_engine()
    real_prefill = engine.runner.prefill

    def prefill(prompts, *args, **kwargs):
        if len(prompts) > 1:
            raise RuntimeError("out of memory for this batch")
        return real_prefill(prompts, *args, **kwargs)

    engine.add(case_request(cases[0], "earlier"))
    engine.step()  # prefilled alone; now decoding
    monkeypatch.setattr(engine.runner, "prefill", prefill)
    engine.add(case_request(cases[1], "a"))
    engine.add(case_request(cases[2], "b"))
    outs = {o.request_id: o for o in engine.step()}
    assert {"a", "b"} <= outs.keys() and outs["a"].finish_reason == outs["b"].finish_reason == "error"
    assert engine.scheduler.get("earlier") is not None  # the running request was not in the failing prefill
