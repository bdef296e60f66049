"""The engine must reproduce `model.generate()` exactly: same greedy tokens and every step's logits
within 1e-4, with image embeddings computed apart from the LLM, requests of different lengths
batched together and joining at different steps, and across a prefill -> decode hand-off whose KV
cache goes through the wire format. The negative controls prove the comparison can fail."""

from __future__ import annotations

import torch

from transport.wire import TensorDescriptor, describe, rebuild


def _assert_all_match(cases, runs, compare):
    problems = [p for case in cases for p in compare(case, runs[case.name].tokens, runs[case.name].logits)]
    assert not problems, "\n".join(problems)


def test_combined_batched_matches_generate(cases, make_engine, case_request, drive, compare):
    engine = make_engine("combined")
    # Two start together; the others join while the first ones decode, so prefills and decodes
    # of different lengths share steps.
    schedule = {0: [case_request(cases[0]), case_request(cases[1])], 2: [case_request(cases[2])],
                4: [case_request(cases[3])]}
    runs = drive(engine, schedule)
    _assert_all_match(cases, runs, compare)
    assert all(runs[c.name].finish_reason == "length" for c in cases)


def test_combined_under_tight_limits_matches_generate(cases, make_engine, case_request, drive, compare):
    # Two sequences at a time and a token budget that fits only one long prompt per step:
    # requests queue, and prefills interleave with decodes of others.
    longest = max(len(c.prompt_ids) for c in cases)
    engine = make_engine("combined", max_num_seqs=2, max_num_batched_tokens=longest + 2)
    runs = drive(engine, {0: [case_request(c) for c in cases]})
    _assert_all_match(cases, runs, compare)


def _over_the_wire(request_id: str, kv: torch.Tensor) -> torch.Tensor:
    desc, raw = describe(request_id, "kv", kv)
    desc = TensorDescriptor.model_validate_json(desc.model_dump_json())
    return rebuild(desc, bytes(raw))


def test_split_prefill_then_decode_matches_generate(cases, make_engine, case_request, drive, compare):
    prefill = make_engine("prefill")
    first = drive(prefill, {0: [case_request(c) for c in cases[:2]], 1: [case_request(c) for c in cases[2:]]})
    decode = make_engine("decode")
    schedule = {}
    for step, case in enumerate(cases):
        (out,) = first[case.name].outputs
        assert not out.finished and out.finish_reason is None and out.handoff_kv is not None
        assert out.handoff_kv.shape[3] == len(case.prompt_ids)
        kv = _over_the_wire(case.name, out.handoff_kv)
        assert torch.equal(kv, out.handoff_kv)
        req = case_request(case, mm_embeddings=None, kv=kv, output_token_ids=list(out.new_token_ids))
        schedule[step] = [req]  # decode requests arrive one step apart
    second = drive(decode, schedule)
    for case in cases:
        a, b = first[case.name], second[case.name]
        problems = compare(case, a.tokens + b.tokens, a.logits + b.logits)
        assert not problems, "\n".join(problems)
        assert b.finish_reason == "length"


def test_prefill_role_keeps_requests_its_first_token_finishes(cases, make_engine, case_request, greedy, drive):
    prefill = make_engine("prefill")
    runs = drive(prefill, {0: [case_request(cases[0], sampling=greedy(1))]})
    (out,) = runs[cases[0].name].outputs
    assert out.finished and out.finish_reason == "length" and out.handoff_kv is None
    assert out.new_token_ids == cases[0].ref_tokens[:1]


def test_comparator_reports_swapped_embeddings(cases, make_engine, case_request, drive, compare):
    a, b = cases[0], cases[3]
    assert a.mm_embeddings.shape == b.mm_embeddings.shape and not torch.equal(a.mm_embeddings, b.mm_embeddings)
    engine = make_engine("combined")
    swapped = [case_request(a, mm_embeddings=b.mm_embeddings), case_request(b, mm_embeddings=a.mm_embeddings)]
    runs = drive(engine, {0: swapped})
    assert compare(a, runs[a.name].tokens, runs[a.name].logits)
    assert compare(b, runs[b.name].tokens, runs[b.name].logits)


def test_comparator_reports_embeddings_one_position_off(cases, make_engine, case_request, drive, compare, tiny):
    case = cases[0]
    image_id = tiny[0].config.image_token_id
    ids = case.prompt_ids
    start = ids.index(image_id)
    n = ids.count(image_id)
    assert start > 0 and ids[start : start + n] == [image_id] * n
    # Move the image block one position earlier: same tokens, same count, embeddings off by one.
    shifted = ids[: start - 1] + ids[start : start + n] + [ids[start - 1]] + ids[start + n :]
    assert len(shifted) == len(ids)
    runs = drive(make_engine("combined"), {0: [case_request(case, prompt_token_ids=shifted)]})
    problems = compare(case, runs[case.name].tokens, runs[case.name].logits)
    assert any("logits" in p for p in problems)
