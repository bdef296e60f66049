"""libsmctrl mask arithmetic (set bit = TPC disabled), 128-bit words, green-context SM rounding."""

from __future__ import annotations

import pytest

from coordinator.policies.sm_partition import SMPartition, SMPartitionConfig, TPCSplit
from native.tpc_mask import (
    enable_mask,
    enabled_tpcs,
    from_words,
    masks_for,
    needs_ext,
    round_sm_request,
    split_ranges,
    to_words,
    tpcs_to_sms,
)


@pytest.mark.parametrize("tpcs, total, mask", [
    (range(4), 8, 0xF0),
    (range(4, 8), 8, 0x0F),
    ({0, 2, 4, 6}, 8, 0xAA),
    (range(8), 8, 0x00),
    (set(), 8, 0xFF),
    ({5}, 8, 0xDF),
    (range(32), 64, 0xFFFF_FFFF_0000_0000),
    (range(64), 64, 0),
    ({63}, 64, 0x7FFF_FFFF_FFFF_FFFF),
])
def test_set_bits_disable(tpcs, total, mask):
    assert enable_mask(tpcs, total) == mask
    assert enabled_tpcs(mask, total) == frozenset(tpcs)


def test_bits_above_the_gpu_stay_clear():
    assert enable_mask(range(2), 5) == 0b11100
    assert enable_mask(range(66), 66) == 0


def test_split_ranges_are_disjoint_and_cover():
    for total in (1, 8, 64, 66, 128):
        for first in range(total + 1):
            a, b = split_ranges(total, first)
            assert set(a).isdisjoint(b) and set(a) | set(b) == set(range(total))
            assert len(a) == first
            ma, mb = enable_mask(a, total), enable_mask(b, total)
            # Each TPC is enabled (bit clear) for exactly one side: never disabled for both, nor enabled for both.
            assert ma & mb == 0
            assert ~ma & ~mb & ((1 << total) - 1) == 0


def test_more_than_64_tpcs_split_into_two_words():
    total = 66  # H100/H200: 132 SMs
    mask = enable_mask(range(33), total)  # encoder on 0-32, rest disabled
    low, high = to_words(mask, total)
    assert low == 0xFFFF_FFFE_0000_0000
    assert high == 0b11
    assert from_words(low, high) == mask
    assert needs_ext(total) and not needs_ext(64)
    assert to_words(enable_mask({70}, 71), 71) == ((1 << 64) - 1, 0b011_1111)
    assert to_words(0xF0, 8) == (0xF0, 0)
    full = enable_mask(set(), 128)
    assert to_words(full, 128) == ((1 << 64) - 1, (1 << 64) - 1)


@pytest.mark.parametrize("bad, match", [
    (lambda: enable_mask({8}, 8), "TPC 8"),
    (lambda: enable_mask({-1}, 8), "TPC -1"),
    (lambda: enable_mask({0}, 129), "total_tpcs=129"),
    (lambda: enable_mask({0}, 0), "total_tpcs=0"),
    (lambda: to_words(0x1FF, 8), "0x1ff"),
    (lambda: split_ranges(8, 9), "first_tpcs=9"),
    (lambda: from_words(1 << 64, 0), "low64"),
])
def test_validation_names_the_values(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_masks_for_a_split():
    enc, pre = masks_for(TPCSplit(3, 5, "dynamic"), 8)
    assert (enc, pre) == (0xF8, 0x07)
    assert masks_for(TPCSplit(8, 8, "none"), 8) == (0, 0)
    assert masks_for(TPCSplit(8, 0, "dynamic"), 8) == (0x00, 0xFF)
    with pytest.raises(ValueError, match="total_tpcs=8"):
        masks_for(TPCSplit(5, 5, "static"), 8)


@pytest.mark.parametrize("total", [1, 2, 29, 64, 66, 128])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_policy_masks_are_disjoint_and_cover(total, mode):
    p = SMPartition(total, SMPartitionConfig(mode=mode))
    every = (1 << total) - 1
    for backlog in (0, 10, 1000, 10**6):
        for tokens in (0, 100, 5000):
            enc, pre = masks_for(p.split(1 if tokens else 0, tokens, backlog), total)
            enabled_enc, enabled_pre = ~enc & every, ~pre & every
            assert enabled_enc & enabled_pre == 0
            assert enabled_enc | enabled_pre == every


@pytest.mark.parametrize("arch, table", [
    ("ampere", {1: 4, 2: 4, 4: 4, 5: 6, 6: 6, 7: 8, 33: 34, 108: 108}),
    ("ada", {1: 4, 3: 4, 4: 4, 9: 10, 57: 58, 128: 128}),
    ("hopper", {1: 8, 8: 8, 9: 16, 16: 16, 17: 24, 65: 72, 132: 136}),
])
def test_green_context_rounding(arch, table):
    assert {sms: round_sm_request(sms, arch) for sms in table} == table


@pytest.mark.parametrize("sms, arch, gpu_sms, granted", [
    (130, "hopper", 132, 128),  # fewer than asked: 132 SMs hold at most 16 groups of 8
    (132, "hopper", 132, 128),
    (200, "ada", 128, 128),
    (58, "ada", 58, 58),  # L4
    (59, "ada", 58, 58),
    (1, "ampere", 108, 4),
])
def test_green_context_never_more_than_the_gpu_has(sms, arch, gpu_sms, granted):
    assert round_sm_request(sms, arch, gpu_sms) == granted


def test_green_context_validation():
    with pytest.raises(ValueError, match="arch='volta'"):
        round_sm_request(4, "volta")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sms=0"):
        round_sm_request(0, "ada")
    with pytest.raises(ValueError, match="gpu_sms=6"):
        round_sm_request(4, "hopper", 6)


def test_tpcs_to_sms():
    assert tpcs_to_sms(66) == 132
