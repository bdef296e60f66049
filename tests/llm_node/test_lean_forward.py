"""LeanLlama (llm_node/lean_forward.py) gives bit for bit what transformers' LlamaModel forward gives: prefill
logits and caches of a right-padded batch with image embeddings, and decode steps of a left-padded batch
(tests/llm_node/test_decode_batches.py checks decode steps against the model's forward with joins and leaves too).
It takes only a stock LlamaModel; anything else keeps transformers' forward."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama as llama
from transformers.models.llama.modeling_llama import LlamaModel

from llm_node.lean_forward import LeanLlama
from llm_node.model_runner import ModelRunner


@pytest.fixture
def one_thread():
    """Exact comparisons on one thread (as test_decode_batches.py: a multi-threaded kernel may split rows
    differently between two calls)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runners(tiny):
    model, _ = tiny
    lean, plain = ModelRunner(model), ModelRunner(model, lean=False)
    assert lean.lean is not None and plain.lean is None
    return lean, plain


def test_only_a_stock_llama_model_is_taken(tiny):
    model, _ = tiny
    language_model = model.model.language_model
    assert type(language_model) is LlamaModel and LeanLlama.wrap(language_model) is not None

    class Patched(LlamaModel):
        """A subclass may change the forward: not taken."""

    patched = Patched.__new__(Patched)
    patched.__dict__.update(language_model.__dict__)
    assert LeanLlama.wrap(patched) is None
    language_model.train()
    try:
        assert LeanLlama.wrap(language_model) is None  # dropout would apply in training mode
    finally:
        language_model.eval()
    assert LeanLlama.wrap(model.model.vision_tower) is None


def test_prefill_is_bit_identical(runners, cases, one_thread):
    lean, plain = runners
    prompts = [c.prompt_ids for c in cases]  # different lengths: a right-padded batch with masks
    mm = [c.mm_embeddings for c in cases]
    a, b = lean.prefill(prompts, mm), plain.prefill(prompts, mm)
    assert torch.equal(a.logits, b.logits)
    for x, y in zip(a.kvs, b.kvs, strict=True):
        assert x.length == y.length and torch.equal(x.export(), y.export())
    one = lean.prefill(prompts[:1], mm[:1])  # one prompt: no padding, no mask
    assert torch.equal(one.logits, plain.prefill(prompts[:1], mm[:1]).logits)


def test_decode_steps_are_bit_identical(runners, cases, one_thread):
    lean, plain = runners
    prompts, mm = [c.prompt_ids for c in cases], [c.mm_embeddings for c in cases]
    kvs_lean, kvs_plain = lean.prefill(prompts, mm).kvs, plain.prefill(prompts, mm).kvs
    tokens = [7, 11, 13, 17]
    for _ in range(4):
        a, b = lean.decode(tokens, kvs_lean), plain.decode(tokens, kvs_plain)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.new_kv, b.new_kv)
        for i in range(len(tokens)):
            kvs_lean[i].append(a.new_kv[:, :, i])
            kvs_plain[i].append(b.new_kv[:, :, i])
        tokens = a.logits.argmax(-1).tolist()


def test_a_changed_forward_is_caught(runners, cases, one_thread, monkeypatch):
    """The comparison can fail: a lean forward that leaves out the rotary embedding differs."""
    lean, plain = runners
    case = cases[0]
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", lambda q, k, cos, sin: (q, k))
    a = lean.prefill([case.prompt_ids], [case.mm_embeddings])
    monkeypatch.undo()
    assert not torch.equal(a.logits, plain.prefill([case.prompt_ids], [case.mm_embeddings]).logits)


def test_a_hooked_model_runs_through_its_own_forward(runners, cases):
    """Hooks (a stealing worker's preemption checks between layers) fire only through module calls: while one is
    registered the runner takes the model's forward, and the lean one again once it is gone."""
    lean, _ = runners
    case, calls = cases[0], []
    layers = lean.lean.model.layers
    handle = layers[1].register_forward_pre_hook(lambda module, args: calls.append(module))
    try:
        lean.prefill([case.prompt_ids], [case.mm_embeddings])
        assert calls == [layers[1]]
    finally:
        handle.remove()
    lean.prefill([case.prompt_ids], [case.mm_embeddings])
    assert calls == [layers[1]] and not lean.lean.hooked()
