"""Engine behaviour around requests: stop conditions, aborts, validation, timings, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from coordinator.protocol.messages import SamplingParams
from llm_node.engine import EngineConfig, EngineRequest


def test_max_tokens_finishes_with_length(cases, make_engine, case_request, greedy, drive):
    runs = drive(make_engine(), {0: [case_request(cases[1], sampling=greedy(3))]})
    run = runs[cases[1].name]
    assert run.tokens == cases[1].ref_tokens[:3] and run.finish_reason == "length"
    assert [o.finished for o in run.outputs] == [False, False, True]


def test_stop_token_id_finishes_with_stop(cases, make_engine, case_request, greedy, drive):
    case = cases[0]
    stop_token = case.ref_tokens[2]
    n = case.ref_tokens.index(stop_token) + 1
    runs = drive(make_engine(), {0: [case_request(case, sampling=greedy(8, stop_token_ids=(stop_token,)))]})
    assert runs[case.name].tokens == case.ref_tokens[:n]
    assert runs[case.name].finish_reason == "stop"


def test_eos_finishes_unless_ignored(cases, make_engine, case_request, greedy, drive):
    case = cases[1]
    eos = case.ref_tokens[1]
    stopping = make_engine()
    stopping.eos_ids = frozenset({eos})
    runs = drive(stopping, {0: [case_request(case, sampling=SamplingParams(max_tokens=5))]})
    assert runs[case.name].tokens == case.ref_tokens[: case.ref_tokens.index(eos) + 1]
    assert runs[case.name].finish_reason == "stop"
    ignoring = make_engine()
    ignoring.eos_ids = frozenset({eos})
    runs = drive(ignoring, {0: [case_request(case, sampling=greedy(5))]})
    assert runs[case.name].tokens == case.ref_tokens and runs[case.name].finish_reason == "length"


def test_stop_string_cuts_the_text(cases, make_engine, case_request, greedy, drive, tokenizer):
    case = cases[2]
    full = drive(make_engine(), {0: [case_request(case)]})[case.name].text
    assert full == tokenizer.decode(case.ref_tokens, skip_special_tokens=True)
    # A stop string from the middle of the text: the text before it comes out, nothing after.
    stop = next(full[i : i + 3] for i in range(len(full) // 3, len(full) - 3) if full[i : i + 3].strip())
    runs = drive(make_engine(), {0: [case_request(case, sampling=greedy(12, stop=(stop,)))]})
    assert runs[case.name].text == full[: full.index(stop)]
    assert runs[case.name].finish_reason == "stop"


def test_abort_removes_waiting_and_running(cases, make_engine, case_request):
    engine = make_engine(max_num_seqs=1)
    engine.add(case_request(cases[0], "running"))
    engine.add(case_request(cases[1], "waiting"))
    assert {o.request_id for o in engine.step()} == {"running"}
    out = engine.abort("waiting")
    assert out.finished and out.finish_reason == "abort" and out.new_token_ids == []
    assert engine.abort("running").finish_reason == "abort"
    assert engine.abort("unknown") is None
    assert not engine.has_unfinished() and engine.step() == []


def test_timings_are_charged_per_step(cases, make_engine, case_request, drive):
    runs = drive(make_engine(), {0: [case_request(cases[0]), case_request(cases[1])]})
    for case in cases[:2]:
        first, *rest = runs[case.name].outputs
        assert first.prefill_s > 0 and first.decode_s == 0
        assert all(o.decode_s > 0 and o.prefill_s == 0 for o in rest)


def test_seeded_sampling_is_reproducible_and_survives_a_handoff(cases, make_engine, case_request, drive):
    case = cases[0]
    params = SamplingParams(max_tokens=8, temperature=1.5, seed=1234, ignore_eos=True)
    once = drive(make_engine(), {0: [case_request(case, sampling=params)]})[case.name].tokens
    again = drive(make_engine(), {0: [case_request(case, sampling=params)]})[case.name].tokens
    assert once == again and once != case.ref_tokens
    (handoff,) = drive(make_engine("prefill"), {0: [case_request(case, sampling=params)]})[case.name].outputs
    req = case_request(case, sampling=params, mm_embeddings=None, kv=handoff.handoff_kv,
                       output_token_ids=handoff.new_token_ids)
    rest = drive(make_engine("decode"), {0: [req]})[case.name].tokens
    assert handoff.new_token_ids + rest == once


def test_mismatched_embeddings_are_rejected(cases, make_engine, case_request):
    engine = make_engine()
    case = cases[0]
    with pytest.raises(ValueError, match=r"196 placeholder positions .* but 195 modality"):
        engine.add(case_request(case, mm_embeddings=case.mm_embeddings[:-1]))
    with pytest.raises(ValueError, match="0 modality embedding rows"):
        engine.add(case_request(case, mm_embeddings=None))
    with pytest.raises(ValueError, match=r"0 placeholder positions .* but 196"):
        engine.add(case_request(cases[1], mm_embeddings=case.mm_embeddings))
    assert not engine.has_unfinished()


def test_requests_the_role_cannot_take_are_rejected(cases, make_engine, case_request, greedy):
    case = cases[1]
    kv = torch.zeros(4, 2, 2, len(case.prompt_ids), 32)
    with pytest.raises(ValueError, match="needs kv"):
        make_engine("decode").add(case_request(case))
    with pytest.raises(ValueError, match=r"shape .* != expected"):
        make_engine("decode").add(case_request(case, kv=kv, output_token_ids=[5, 6]))
    with pytest.raises(ValueError, match="only for a decode engine"):
        make_engine("combined").add(case_request(case, kv=kv, output_token_ids=[5]))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_engine(max_num_batched_tokens=len(case.prompt_ids) - 1).add(case_request(case))
    engine = make_engine()
    engine.add(case_request(case))
    with pytest.raises(ValueError, match="already"):
        engine.add(case_request(case))
    assert make_engine("decode").add(case_request(case, kv=kv, output_token_ids=[5])) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [({"role": "both"}, "role='both'"), ({"max_num_seqs": 0}, "max_num_seqs=0"),
     ({"max_num_seqs": 8, "max_num_batched_tokens": 4}, "max_num_batched_tokens=4")],
)
def test_engine_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_engine_request_defaults():
    req = EngineRequest("r", [1, 2], SamplingParams())
    assert req.mm_embeddings is None and req.kv is None and req.output_token_ids == []
