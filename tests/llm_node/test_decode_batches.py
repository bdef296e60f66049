"""DecodeBatches (llm_node/batch_cache.py): the decode batch's buffer is kept from step to step while sequences
join, leave, or miss an append, and every step's logits and new cache entries are bit for bit those of a batch
padded afresh with zeros (llm_node/kv.py build_decode_batch on a plain DynamicCache)."""

from __future__ import annotations

import random

import pytest
import torch

from llm_node.kv import build_decode_batch, new_positions
from llm_node.model_runner import ModelRunner


@pytest.fixture
def one_thread():
    """With several threads, a kernel that splits a batch's rows between them can give one row a different last
    bit depending on its place in the batch (any batching does that); the buffer keeps rows in its own order, so
    exactness against a batch in the caller's order is checked with one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _prefilled(runner: ModelRunner, prompts: list[list[int]]):
    result = runner.prefill(prompts, [None] * len(prompts))
    return result.kvs, result.logits.argmax(-1).tolist()


@torch.inference_mode()
def _reference(runner: ModelRunner, tokens: list[int], kvs):
    """The step as a batch padded afresh: zeros in the padding, the model's own concatenating cache."""
    batch = build_decode_batch(kvs, runner.config)
    inputs = runner.model.get_input_embeddings()(torch.tensor(tokens).unsqueeze(1))
    out = runner.arch.language_model(inputs_embeds=inputs, attention_mask=batch.attention_mask,
                                     position_ids=batch.position_ids, use_cache=True,
                                     **{runner._cache_kw: batch.cache})
    return runner.model.lm_head(out.last_hidden_state[:, -1]).float(), new_positions(batch.cache)


def _step(runner: ModelRunner, tokens: list[int], kvs, append: bool = True) -> list[int]:
    out = runner.decode(tokens, kvs)
    logits, new_kv = _reference(runner, tokens, kvs)
    assert torch.equal(out.logits, logits)
    assert torch.equal(out.new_kv, new_kv)
    if append:
        for i, kv in enumerate(kvs):
            kv.append(out.new_kv[:, :, i])
    return out.logits.argmax(-1).tolist()


def test_same_sequences_reuse_the_buffer_with_identical_logits(tiny):
    runner = ModelRunner(tiny[0])
    kvs, tokens = _prefilled(runner, [[1, 5, 9, 12, 30, 31, 40], [1, 7, 8]])  # different lengths: left padding
    for step in range(6):
        reused = runner.decode_batches.reused
        tokens = _step(runner, tokens, kvs)
        if step > 0:  # the same two sequences, each one position longer: nothing copied in
            assert runner.decode_batches.reused == reused + 1
    assert runner.decode_batches.layouts == 1


def test_joins_leaves_and_a_missed_append_copy_one_row_each(tiny, one_thread):
    runner = ModelRunner(tiny[0])
    batches = runner.decode_batches
    kvs, tokens = _prefilled(runner, [[1, 5, 9, 12], [1, 7, 8, 3, 5, 6]])
    tokens = _step(runner, tokens, kvs)

    joined, first = _prefilled(runner, [[1, 2, 3]])
    copied = batches.rows_copied
    tokens = _step(runner, tokens + first, kvs + joined)  # a third sequence joins: its own cache copied in
    assert (batches.rows_copied, batches.layouts) == (copied + 1, 1)

    tokens = _step(runner, tokens, kvs + joined, append=False)  # the step's results are dropped
    _step(runner, tokens, kvs + joined)  # every row is one short of the buffer: each is copied in again
    assert (batches.rows_copied, batches.layouts) == (copied + 4, 1)

    # The first sequence leaves: the last row moves into its place, and the rows are no longer the caller's order.
    rest = [kvs[1], joined[0]]
    reused = batches.reused
    out = runner.decode([4, 9], rest)
    assert out.logits.shape[0] == 2 and runner.decode_batches.reused == reused + 1
    logits, _ = _reference(runner, [4, 9], rest)
    assert torch.equal(out.logits, logits)


def test_random_churn_matches_a_batch_padded_afresh_at_every_step(tiny, one_thread):
    """Joins, leaves, dropped results, a joiner longer than the window and a reordered caller: every step exact."""
    runner = ModelRunner(tiny[0])
    rng = random.Random(7)
    live: list[tuple] = []  # (kv, next token)
    for step in range(40):
        if not live or rng.random() < 0.35:
            n = rng.choice([3, 5, 9, 17]) if step != 25 else 120  # step 25: longer than the window holds
            kvs, firsts = _prefilled(runner, [[1] + [rng.randrange(10, 900) for _ in range(n)]])
            live.append((kvs[0], firsts[0]))
        if len(live) > 1 and rng.random() < 0.3:
            live.pop(rng.randrange(len(live)))
        if rng.random() < 0.2:
            rng.shuffle(live)
        append = rng.random() > 0.1
        tokens = _step(runner, [t for _, t in live], [kv for kv, _ in live], append=append)
        if append:
            live = [(kv, t) for (kv, _), t in zip(live, tokens)]
    batches = runner.decode_batches
    assert batches.steps == 40 and 2 <= batches.layouts <= 8, (batches.steps, batches.layouts)


def test_an_idle_engine_keeps_no_decode_batch(make_engine, cases, case_request, drive):
    engine = make_engine("combined")
    drive(engine, {0: [case_request(cases[0]), case_request(cases[1])]})
    assert engine.runner.decode_batches.reused > 0  # the two decoded together over several steps
    assert not engine.has_unfinished() and not engine.runner.decode_batches.keeping


def test_when_the_columns_run_out_the_buffer_is_laid_out_again_in_its_own_memory(tiny, one_thread):
    """A fresh buffer is tens of MB to zero at serving sizes: laying out again reuses the held one when it has the
    room, with every step still exact (stale keys in the padding get weight exactly 0)."""
    runner = ModelRunner(tiny[0])
    batches = runner.decode_batches
    rng = random.Random(3)
    kvs, tokens = _prefilled(runner, [[1] + [rng.randrange(10, 900) for _ in range(n)] for n in (149, 120)])
    tokens = _step(runner, tokens, kvs)
    memory, columns = batches._buf.kv.data_ptr(), batches._buf.kv.shape[4]
    assert (batches.layouts, batches.allocations) == (1, 1)
    for _ in range(columns):  # until the columns run out
        tokens = _step(runner, tokens, kvs)
        if batches.layouts == 2:
            break
    assert (batches.layouts, batches.allocations) == (2, 1)
    assert batches._buf.kv.data_ptr() == memory
    # A joiner longer than the buffer's columns needs a fresh, larger buffer.
    joined, first = _prefilled(runner, [[1] + [rng.randrange(10, 900) for _ in range(columns)]])
    _step(runner, tokens + first, kvs + joined)
    assert batches.allocations == 2 and batches._buf.kv.shape[4] > columns


def test_a_buffer_has_no_more_rows_than_a_step_can_hold(tiny, make_engine):
    runner = ModelRunner(tiny[0])
    runner.decode_batches.max_rows = 3
    kvs, tokens = _prefilled(runner, [[1, 5, 9], [1, 7], [1, 2, 3, 5]])
    _step(runner, tokens, kvs)
    assert runner.decode_batches._buf.kv.shape[2] == 3  # not twice the rows, as without a bound
    assert make_engine(max_num_seqs=5).runner.decode_batches.max_rows == 5  # the engine's own bound
