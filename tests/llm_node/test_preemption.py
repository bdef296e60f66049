"""A stealing worker's prefill gives way to the encoder between layers, changing nothing, and is never starved."""

from __future__ import annotations

import pytest
import torch

from llm_node.preemption import Preempted, PrefillPreemption, decoder_layers


@pytest.fixture
def preemptible(tiny):
    """Install preemption hooks on the shared tiny model for one test; `asks` counts hook calls."""
    made = []

    def install(should_yield, max_in_a_row: int = 3) -> PrefillPreemption:
        p = PrefillPreemption(tiny[0], should_yield, max_in_a_row)
        made.append(p)
        return p

    yield install
    for p in made:
        p.remove()


def test_a_preempted_prefill_is_retried_and_gives_the_exact_answer(cases, make_engine, case_request, preemptible):
    case = cases[3]
    engine = make_engine()
    answers = iter([False, False, True])  # the encoder arrives during layer 3 of the first prefill
    engine.preemption = preemptible(lambda: next(answers, False))
    engine.add(case_request(case))
    with pytest.raises(Preempted):
        engine.step()
    assert [s.request_id for s in engine.scheduler.waiting] == [case.name] and not engine.scheduler.running
    tokens, logits = [], []
    for _ in range(len(case.ref_tokens)):
        for out in engine.step():
            tokens += out.new_token_ids
            logits += out.logits
    assert tokens == case.ref_tokens
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(logits, case.ref_logits))
    assert engine.preemption.total == 1


def test_decode_steps_are_never_preempted(cases, make_engine, case_request, preemptible):
    engine = make_engine()
    yielding = [False]
    engine.preemption = preemptible(lambda: yielding[0])
    engine.add(case_request(cases[1]))
    engine.step()  # the prefill
    yielding[0] = True
    assert engine.step() and engine.preemption.total == 0


def test_after_max_in_a_row_the_prefill_runs_to_the_end(cases, make_engine, case_request, preemptible):
    engine = make_engine()
    engine.preemption = preemptible(lambda: True, max_in_a_row=2)
    engine.add(case_request(cases[0]))
    for _ in range(2):
        with pytest.raises(Preempted):
            engine.step()
    outs = engine.step()
    assert outs[0].new_token_ids == cases[0].ref_tokens[:1] and engine.preemption.total == 2
    assert engine.preemption.in_a_row == 0  # reset once a prefill completes


def test_a_model_without_decoder_layers_is_refused():
    with pytest.raises(ValueError, match="no decoder layers"):
        decoder_layers(torch.nn.Linear(2, 2))
