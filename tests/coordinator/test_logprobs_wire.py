"""TokenEvent's packed log-probabilities: exact float32 round trip, trimming, and malformed packs refused."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from coordinator.protocol.logprobs import PackedLogprobs, TokenLogprobs
from coordinator.protocol.messages import TokenEvent


def make_logprobs(token_ids: list[int], k: int, seed: int = 0) -> list[TokenLogprobs]:
    """What an engine reports for these tokens: float32 log_softmax rows of random logits."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for token in token_ids:
        lp = torch.log_softmax(torch.randn(1000, generator=g), -1)
        top = lp.topk(k)
        out.append(TokenLogprobs(token, lp[token].item(), tuple(zip(top.indices.tolist(), top.values.tolist()))))
    return out


@pytest.mark.parametrize("k", [0, 1, 20])
def test_round_trip_through_redis_json_is_exact(k):
    tokens = [5, 999, 0]
    items = make_logprobs(tokens, k)
    ev = TokenEvent(token_ids=tokens, text="abc", logprobs=PackedLogprobs.pack(items))
    back = TokenEvent.model_validate_json(ev.model_dump_json(exclude_defaults=True))
    assert back.token_logprobs() == items  # float32 values survive bit for bit


def test_tail_drops_the_first_tokens():
    items = make_logprobs([1, 2, 3, 4], 3)
    assert PackedLogprobs.pack(items).tail(2).unpack([3, 4]) == items[2:]


def test_an_event_without_logprobs_has_none():
    assert TokenEvent(token_ids=[1]).token_logprobs() == []


def test_packed_is_a_fraction_of_plain_json():
    items = make_logprobs([7], 20)
    packed = len(PackedLogprobs.pack(items).model_dump_json())
    plain = len(json.dumps([{"token_id": t.token_id, "logprob": t.logprob,
                             "top": [{"token_id": i, "logprob": v} for i, v in t.top]} for t in items]))
    assert packed * 3 < plain


@pytest.mark.parametrize("tokens", [[1], [1, 2, 3]])
def test_logprobs_for_other_tokens_are_refused(tokens):
    packed = PackedLogprobs.pack(make_logprobs([1, 2], 2))
    with pytest.raises(ValidationError, match="describe 2 tokens"):
        TokenEvent.model_validate({"token_ids": tokens, "logprobs": packed.model_dump()})


def test_a_torn_pack_is_refused():
    packed = PackedLogprobs.pack(make_logprobs([1, 2], 2)).model_dump()
    with pytest.raises(ValidationError, match="whole tokens"):
        TokenEvent.model_validate({"token_ids": [1, 2], "logprobs": {**packed, "top_ids": packed["top_ids"][:-1]}})
    with pytest.raises(ValueError):
        PackedLogprobs.pack([TokenLogprobs(1, -0.1, ((1, -0.1),)), TokenLogprobs(2, -0.2)])
