"""Per-token log-probabilities from the reference engine, checked against the model's own logits.

The engine reports log_softmax (float32) of the raw logits each token was sampled from: the same numbers as
`generate()`'s logits give, for the generated token and for the k most likely, in every row of a batch.
"""

from __future__ import annotations

from coordinator.protocol.messages import SamplingParams
from logit_check import logprob_mismatches


def test_greedy_logprobs_match_the_models_logits_in_a_batch(make_engine, cases, case_request, greedy, drive):
    """Four requests of different lengths in one batch, each asking for a different k: every step's logprobs
    are log_softmax of the engine's own logits, and of generate()'s, within 1e-5."""
    ks = [5, 0, 20, 1]
    reqs = [case_request(c, sampling=greedy(len(c.ref_tokens), logprobs=k)) for c, k in zip(cases, ks)]
    runs = drive(make_engine(), {0: reqs[:2], 2: reqs[2:]})
    for case, k in zip(cases, ks):
        run = runs[case.name]
        logprobs = [lp for o in run.outputs for lp in o.logprobs]
        assert run.tokens == case.ref_tokens, case.name
        assert all(len(lp.top) == k for lp in logprobs), case.name
        assert logprob_mismatches(case.name, run.tokens, logprobs, run.logits, k, atol=1e-5) == []
        assert logprob_mismatches(case.name, run.tokens, logprobs, case.ref_logits, k, atol=1e-5) == []
        if k:  # greedy: the generated token is the most likely one
            assert all(lp.top[0] == (lp.token_id, lp.logprob) for lp in logprobs), case.name


def test_sampled_logprobs_describe_the_model_not_the_temperature(make_engine, cases, case_request, drive):
    """At temperature 0.7 the logprobs are still the raw distribution's (vLLM's default); the tempered
    distribution's differ (the negative control)."""
    case = cases[0]
    sampling = SamplingParams(max_tokens=6, temperature=0.7, seed=3, ignore_eos=True, return_logits=True, logprobs=3)
    run = drive(make_engine(), {0: [case_request(case, sampling=sampling)]})[case.name]
    logprobs = [lp for o in run.outputs for lp in o.logprobs]
    assert logprob_mismatches("raw", run.tokens, logprobs, run.logits, 3, atol=1e-5) == []
    tempered = [logits / 0.7 for logits in run.logits]
    assert logprob_mismatches("tempered", run.tokens, logprobs, tempered, 3, atol=1e-5) != []


def test_no_logprobs_unless_asked(make_engine, cases, case_request, greedy, drive):
    case = cases[1]
    run = drive(make_engine(), {0: [case_request(case, sampling=greedy(3))]})[case.name]
    assert run.outputs and all(o.logprobs == [] for o in run.outputs)


def test_logprobs_survive_a_prefill_to_decode_handoff(make_engine, cases, case_request, greedy, drive):
    """The prefill engine reports the first token's logprobs, the decode engine the rest: together they are
    the combined engine's."""
    case = cases[2]
    prefill = drive(make_engine("prefill"), {0: [case_request(case, sampling=greedy(len(case.ref_tokens), logprobs=4))]})
    first = prefill[case.name].outputs[-1]
    assert len(first.logprobs) == 1 and first.handoff_kv is not None
    decode = drive(make_engine("decode"), {0: [case_request(
        case, sampling=greedy(len(case.ref_tokens), logprobs=4), mm_embeddings=None, kv=first.handoff_kv,
        output_token_ids=first.handoff_output_ids)]})[case.name]
    logprobs = first.logprobs + [lp for o in decode.outputs for lp in o.logprobs]
    tokens = first.new_token_ids + decode.tokens
    assert tokens == case.ref_tokens
    assert logprob_mismatches(case.name, tokens, logprobs, first.logits + decode.logits, 4, atol=1e-5) == []
    assert logprob_mismatches(case.name, tokens, logprobs, case.ref_logits, 4, atol=1e-5) == []
