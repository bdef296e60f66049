"""DecodeBatches: a decode step of the same sequences, each one position longer, reuses the previous step's padded
cache, and gives bit for bit the logits of a batch padded afresh; any other change rebuilds."""

from __future__ import annotations

import torch

from llm_node.model_runner import ModelRunner


def _prefilled(runner: ModelRunner, prompts: list[list[int]]):
    result = runner.prefill(prompts, [None] * len(prompts))
    return result.kvs, result.logits.argmax(-1).tolist()


def _fresh_decode(runner: ModelRunner, tokens, kvs):
    runner.decode_batches.clear()
    return runner.decode(tokens, kvs)


def test_same_sequences_reuse_the_padded_cache_with_identical_logits(tiny):
    runner = ModelRunner(tiny[0])
    kvs, tokens = _prefilled(runner, [[1, 5, 9, 12, 30, 31, 40], [1, 7, 8]])  # different lengths: left padding
    for step in range(4):
        reused_before = runner.decode_batches.reused
        out = runner.decode(tokens, kvs)
        if step > 0:  # the same two sequences, each one position longer than the kept batch
            assert runner.decode_batches.reused == reused_before + 1
            fresh = _fresh_decode(runner, tokens, kvs)
            assert torch.equal(out.logits, fresh.logits)
            assert torch.equal(out.new_kv, fresh.new_kv)
            out = runner.decode(tokens, kvs)  # the fresh build is kept now: the next step reuses it
        for i, kv in enumerate(kvs):
            kv.append(out.new_kv[:, :, i])
        tokens = out.logits.argmax(-1).tolist()


def test_a_joining_sequence_or_a_missed_append_rebuilds(tiny):
    runner = ModelRunner(tiny[0])
    kvs, tokens = _prefilled(runner, [[1, 5, 9, 12], [1, 7, 8, 3, 5, 6]])
    out = runner.decode(tokens, kvs)
    for i, kv in enumerate(kvs):
        kv.append(out.new_kv[:, :, i])
    tokens = out.logits.argmax(-1).tolist()

    joined, first = _prefilled(runner, [[1, 2, 3]])
    before = runner.decode_batches.reused
    out = runner.decode(tokens + first, kvs + joined)  # a third sequence joins: padded afresh
    assert runner.decode_batches.reused == before
    fresh = _fresh_decode(runner, tokens + first, kvs + joined)
    assert torch.equal(out.logits, fresh.logits)

    # Nothing appended since the last step (e.g. the step's results were dropped): rebuilt, not reused.
    again = runner.decode(tokens + first, kvs + joined)
    assert runner.decode_batches.reused == before
    assert torch.equal(again.logits, fresh.logits)

    # A sequence leaves: the remaining two are another batch.
    for i, kv in enumerate(kvs + joined):
        kv.append(again.new_kv[:, :, i])
    out = runner.decode(again.logits.argmax(-1).tolist()[:2], kvs)
    assert runner.decode_batches.reused == before
    assert torch.equal(out.logits, _fresh_decode(runner, again.logits.argmax(-1).tolist()[:2], kvs).logits)


def test_an_idle_engine_keeps_no_decode_batch(make_engine, cases, case_request, drive):
    engine = make_engine("combined")
    drive(engine, {0: [case_request(cases[0]), case_request(cases[1])]})
    assert engine.runner.decode_batches.reused > 0  # the two decoded together over several steps
    assert not engine.has_unfinished() and not engine.runner.decode_batches.keeping
