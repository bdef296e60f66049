"""The null engine's contract: the Engine protocol with no model (one instant token per request per step)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from coordinator.protocol.messages import SamplingParams
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from llm_node.__main__ import parse
from llm_node.engine_api import EngineRequest, StepOutput
from llm_node.engine_config import EngineConfig
from llm_node.null_engine import NullEngine


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)


@pytest.fixture
def engine(tok):
    return NullEngine(tok, EngineConfig(max_num_seqs=4), max_model_len=64)


def request(tok, rid: str = "r", text: str = "the quick brown fox jumps", **sampling) -> EngineRequest:
    return EngineRequest(rid, tok(text)["input_ids"], SamplingParams(**({"max_tokens": 6} | sampling)))


def run(engine: NullEngine, max_steps: int = 100) -> dict[str, list[StepOutput]]:
    """Step until nothing is left; each request's outputs in order."""
    outs: dict[str, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outs
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError(f"the engine did not finish within {max_steps} steps")


def test_max_tokens_one_token_per_step_real_text(engine, tok):
    engine.add(request(tok))
    outs = run(engine)["r"]
    tokens = [t for o in outs for t in o.new_token_ids]
    assert [len(o.new_token_ids) for o in outs] == [1] * 6
    assert [o.finished for o in outs] == [False] * 5 + [True] and outs[-1].finish_reason == "length"
    assert not set(tokens) & set(tok.all_special_ids)
    text = "".join(o.new_text for o in outs)
    assert text and text == tok.decode(tokens)  # deltas concatenate to the decoded output
    assert outs[0].prefill_s > 0 and outs[0].decode_s == 0 and all(o.decode_s > 0 for o in outs[1:])


def test_tokens_are_a_function_of_the_prompt(tok):
    def tokens(text: str) -> list[int]:
        e = NullEngine(tok)
        e.add(request(tok, text=text, max_tokens=10))
        return [t for o in run(e)["r"] for t in o.new_token_ids]

    assert tokens("hello there world") == tokens("hello there world")
    assert tokens("hello there world") != tokens("a different prompt entirely")
    assert set(tokens("hello there world")) <= set(tok("hello there world")["input_ids"])


def test_stop_string_cuts_the_text(engine, tok):
    engine.add(request(tok, max_tokens=12))
    full = "".join(o.new_text for o in run(engine)["r"])
    stop = full[len(full) // 2:len(full) // 2 + 3]
    engine.add(request(tok, "s", max_tokens=12, stop=(stop,)))
    outs = run(engine)["s"]
    text = "".join(o.new_text for o in outs)
    assert outs[-1].finish_reason == "stop" and stop not in text and full.startswith(text) and len(outs) < 12


def test_stop_token_id(engine, tok):
    engine.add(request(tok, max_tokens=8))
    third = [t for o in run(engine)["r"] for t in o.new_token_ids][2]
    engine.add(request(tok, "s", max_tokens=8, stop_token_ids=(third,)))
    outs = run(engine)["s"]
    assert outs[-1].finish_reason == "stop" and outs[-1].new_token_ids == [third] and len(outs) <= 3


def test_max_num_seqs_bounds_a_step_and_the_rest_wait(tok):
    e = NullEngine(tok, EngineConfig(max_num_seqs=2))
    for rid in "abc":
        e.add(request(tok, rid, max_tokens=2))
    assert {o.request_id for o in e.step()} == {"a", "b"}
    assert {o.request_id for o in e.step()} == {"a", "b"}  # both finish here
    assert [o.request_id for o in e.step()] == ["c"]


def test_abort(engine, tok):
    engine.add(request(tok, "a"))
    engine.add(request(tok, "b"))
    engine.step()
    final = engine.abort("a")
    assert final is not None and final.finished and final.finish_reason == "abort"
    assert engine.abort("a") is None and engine.abort("never") is None
    assert {o.request_id for o in engine.step()} == {"b"}


def test_resumed_run_continues_after_streamed_tokens(engine, tok):
    engine.add(request(tok, max_tokens=6))
    fresh = run(engine)["r"]
    tokens = [t for o in fresh for t in o.new_token_ids]
    resumed = request(tok, "s", max_tokens=6)
    resumed.output_token_ids = tokens[:2]
    engine.add(resumed)
    outs = run(engine)["s"]
    assert [t for o in outs for t in o.new_token_ids] == tokens[2:]
    assert "".join(o.new_text for o in outs) == "".join(o.new_text for o in fresh[2:])


@pytest.mark.parametrize("change, why", [
    (lambda r: setattr(r, "prompt_token_ids", []), "empty prompt"),
    (lambda r: setattr(r, "prompt_token_ids", [10**9]), "outside the vocabulary"),
    (lambda r: setattr(r, "sampling", SamplingParams(max_tokens=2, logprobs=1)), "logprobs"),
    (lambda r: setattr(r, "sampling", SamplingParams(max_tokens=2, return_logits=True)), "logprobs or logits"),
    (lambda r: setattr(r, "kv", torch.zeros(1)), "KV cache"),
    (lambda r: setattr(r, "sampling", SamplingParams(max_tokens=64)), "positions"),
    (lambda r: setattr(r, "output_token_ids", [5, 5, 5, 5, 5, 5]), "already reach max_tokens"),
])
def test_refuses_what_it_cannot_run_and_keeps_nothing(engine, tok, change, why):
    r = request(tok)
    change(r)
    with pytest.raises(ValueError, match=why):
        engine.add(r)
    assert not engine.has_unfinished()


def test_refuses_duplicates(engine, tok):
    engine.add(request(tok))
    with pytest.raises(ValueError, match="already in this engine"):
        engine.add(request(tok))


def test_only_the_combined_role(tok):
    with pytest.raises(ValueError, match="only the combined role"):
        NullEngine(tok, EngineConfig(role="prefill"))
    with pytest.raises(SystemExit):
        parse(["--worker-id", "x", "--engine", "null", "--role", "decode"])
    assert parse(["--worker-id", "x", "--engine", "null"]).engine == "null"
