"""Batch sampling with per-request parameters and generators."""

from __future__ import annotations

import pytest
import torch

from coordinator.protocol.messages import SamplingParams
from llm_node.sampling import make_generator, reseed_for_index, sample, top_p_filter

VOCAB = 64


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _draws(params: SamplingParams, n: int = 20, logits: torch.Tensor | None = None) -> list[int]:
    """n tokens for one request, re-seeding per index as the engine does."""
    logits = _logits() if logits is None else logits
    gen = make_generator(params.seed)
    return [sample(logits, [params], [reseed_for_index(gen, params.seed, i)])[0] for i in range(n)]


def test_greedy_rows_take_the_argmax():
    logits = _logits(3)
    params = [SamplingParams(temperature=0.0)] * 3
    assert sample(logits, params, [make_generator(None)] * 3) == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed():
    hot = SamplingParams(temperature=2.0, seed=7)
    assert _draws(hot) == _draws(hot)
    assert _draws(hot) != _draws(SamplingParams(temperature=2.0, seed=8))
    assert len(set(_draws(hot))) > 3  # it really samples


def test_unseeded_requests_differ():
    hot = SamplingParams(temperature=2.0)
    assert _draws(hot) != _draws(hot)


def test_tiny_top_p_is_greedy():
    logits = _logits(4, seed=3)
    params = [SamplingParams(temperature=1.0, top_p=1e-6, seed=s) for s in range(4)]
    gens = [make_generator(p.seed) for p in params]
    for _ in range(5):
        assert sample(logits, params, gens) == logits.argmax(-1).tolist()


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs = torch.tensor([0.1, 0.5, 0.15, 0.25])

    def kept(top_p):
        out = top_p_filter(probs, top_p)
        assert torch.equal(out[out > 0], probs[out > 0])  # survivors keep their probability
        return (out > 0).tolist()

    assert kept(0.4) == [False, True, False, False]
    assert kept(0.7) == [False, True, False, True]
    assert kept(0.8) == [False, True, True, True]
    assert kept(1.0) == [True, True, True, True]


def test_rows_use_their_own_params():
    logits = _logits(2, seed=5)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=5.0, seed=1)]
    tokens = {tuple(sample(logits, params, [make_generator(None), make_generator(i)])) for i in range(30)}
    assert {t[0] for t in tokens} == {int(logits[0].argmax())}
    assert len({t[1] for t in tokens}) > 5


def test_mismatched_batch_is_an_error():
    with pytest.raises(ValueError, match="one row per request"):
        sample(_logits(2), [SamplingParams()], [make_generator(None)])


def test_vanishing_temperature_is_greedy_not_nan():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    params = [SamplingParams(temperature=1e-39), SamplingParams(temperature=1e-30, top_p=0.5)]
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    assert sample(logits, params, gens) == [1, 0]


def test_a_top_p_below_float32_range_keeps_the_top_token():
    """Found by the schema fuzzer: top_p=1.26e-112 compared as float32 0.0 and dropped every token."""
    import torch

    from coordinator.protocol.messages import SamplingParams
    from llm_node.sampling import make_generator, sample

    logits = torch.tensor([[0.1, 3.0, 0.2]])
    assert sample(logits, [SamplingParams(temperature=1.0, top_p=1.2584840334681273e-112)], [make_generator(0)]) == [1]
