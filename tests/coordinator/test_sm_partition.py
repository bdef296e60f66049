"""SMPartition: disjoint covering splits, the three modes, minimum shares, monotonicity."""

from __future__ import annotations

import itertools

import pytest

from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig, TPCSplit


def policy(total: int = 64, **knobs) -> SMPartition:
    return SMPartition(total, SMPartitionConfig(**knobs))


BACKLOGS = [0, 1, 10, 100, 500, 1000, 2000, 5000, 20000, 10**6]
ENCODER = [(0, 0), (1, 0), (1, 64), (4, 576), (8, 4608), (16, 20000)]
TOTALS = [1, 2, 3, 7, 29, 64, 66, 71, 128]


def test_none_gives_both_sides_everything():
    assert policy(64, mode="none").split(4, 1000, 1000) == TPCSplit(64, 64, "none")


@pytest.mark.parametrize("fraction, total, encoder", [(0.5, 64, 32), (0.5, 7, 4), (0.25, 66, 17),
                                                      (0.01, 64, 1), (0.99, 64, 63), (0.5, 1, 1)])
def test_static_is_a_fixed_fraction(fraction, total, encoder):
    p = policy(total, mode="static", static_encoder_fraction=fraction)
    for requests, tokens in ENCODER:
        for backlog in BACKLOGS:
            assert p.split(requests, tokens, backlog) == TPCSplit(encoder, total - encoder, "static")


def test_dynamic_default_is_proportional():
    p = policy(64, min_share=0.0)
    assert p.split(4, 1000, 1000) == TPCSplit(32, 32, "dynamic")
    assert p.split(4, 3000, 1000) == TPCSplit(48, 16, "dynamic")
    assert policy(64, min_share=0.0, encoder_token_cost=3.0).split(4, 1000, 1000).encoder_tpcs == 48


def test_dynamic_one_side_idle_gets_nothing():
    p = policy(64)
    assert p.split(4, 1000, 0) == TPCSplit(64, 0, "dynamic")
    assert p.split(0, 0, 1000) == TPCSplit(0, 64, "dynamic")
    assert p.split(0, 0, 0) == TPCSplit(64, 0, "dynamic")


def test_dynamic_minimum_share_for_a_side_with_work():
    p = policy(64, min_share=0.25)
    assert p.split(1, 1, 10**9).encoder_tpcs == 16
    assert p.split(16, 10**9, 1).prefill_tpcs == 16
    # Even with min_share 0 a side with work keeps one TPC.
    assert policy(64, min_share=0.0).split(1, 1, 10**9) == TPCSplit(1, 63, "dynamic")
    # Requests with an unknown (zero) token count still count as encoder work.
    assert policy(64).split(2, 0, 5000).encoder_tpcs == 16


def test_request_cost_counts_as_encoder_work():
    base = policy(64, min_share=0.0)
    costly = policy(64, min_share=0.0, encoder_request_cost=500.0)
    assert costly.split(2, 1000, 2000).encoder_tpcs > base.split(2, 1000, 2000).encoder_tpcs


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("total", TOTALS)
def test_disjoint_and_covering(mode, total):
    for min_share in (0.0, 0.1, 0.25, 0.5):
        p = policy(total, mode=mode, min_share=min_share)
        for (requests, tokens), backlog in itertools.product(ENCODER, BACKLOGS):
            split = p.split(requests, tokens, backlog)
            assert split.encoder_tpcs >= 0 and split.prefill_tpcs >= 0
            assert split.encoder_tpcs + split.prefill_tpcs == total, split
            if mode == "dynamic" and total >= 2 and backlog and (requests or tokens):
                assert split.encoder_tpcs >= 1 and split.prefill_tpcs >= 1, split


@pytest.mark.parametrize("total", TOTALS)
@pytest.mark.parametrize("min_share", [0.0, 0.25, 0.5])
def test_more_backlog_never_gives_prefill_fewer_tpcs(total, min_share):
    p = policy(total, min_share=min_share, encoder_token_cost=0.7, encoder_request_cost=3.0)
    for requests, tokens in ENCODER:
        prefill = [p.split(requests, tokens, b).prefill_tpcs for b in range(0, 30000, 37)]
        assert prefill == sorted(prefill), (requests, tokens)


@pytest.mark.parametrize("total", TOTALS)
def test_more_encoder_work_never_gives_encoder_fewer_tpcs(total):
    p = policy(total)
    for backlog in BACKLOGS:
        encoder = [p.split(4, t, backlog).encoder_tpcs for t in range(0, 30000, 41)]
        assert encoder == sorted(encoder), backlog


def test_invalid_inputs_name_the_values():
    with pytest.raises(ValueError, match="total_tpcs=0"):
        SMPartition(0)
    with pytest.raises(ValueError, match="prefill_backlog_tokens=-1"):
        policy().split(1, 1, -1)
    with pytest.raises(ValueError, match="(?s)mode.*half"):
        SMPartitionConfig(mode="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_share"):
        SMPartitionConfig(min_share=0.6)
    with pytest.raises(ValueError, match="static_encoder_fraction"):
        SMPartitionConfig(static_encoder_fraction=1.0)
    with pytest.raises(ValueError, match="encoder_token_cost"):
        SMPartitionConfig(encoder_token_cost=0.0)
