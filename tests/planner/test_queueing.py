"""HAS stage 1 against hand-computed examples: rho per stage (rho_P with n_L and alpha), the filters,
B_max and the s window."""

from __future__ import annotations

import math

import pytest

from coordinator.planner.allocation import enumerate_inventory, parse_allocation, parse_inventory
from coordinator.planner.arch import PRESETS
from coordinator.planner.capacity import RequestShape, TierCapacity, capacities, host_check
from coordinator.planner.catalog import load_catalog
from coordinator.planner.perf import PerfModel
from coordinator.planner.queueing import Stage1Config, b_max, s_window, stage1, stage_loads

# Two made-up tiers under real catalog names (the names only matter for prices): "A" and "B".
A, B = "L4", "H100"
CAPS = {
    A: TierCapacity(tier=A, encode=10, prefill=4, decode=5, local_prefill=4),
    B: TierCapacity(tier=B, encode=20, prefill=8, decode=10, local_prefill=8),
}


def loads(spec: str, rate: float, alpha: float = 0.5):
    return stage_loads(parse_allocation(spec), rate, CAPS, alpha)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_homogeneous_example_matches_easerve_formulas():
    # n_E = 4 (2 E+P counted), n_P = 2, n_L = 2, n_D = 2, Lambda = 6, alpha = 0.5:
    # rho_E = (6/4)/10 = 0.15; rho_P = 6 / (4 * (2 + 2*0.5)) = 0.5; rho_D = (6/2)/5 = 0.6.
    got = loads("2xL4:E,2xL4:E+P,2xL4:P,2xL4:D", 6)
    assert (got.rho_e, got.rho_p, got.rho_d) == pytest.approx((0.15, 0.5, 0.6))
    assert got.score == pytest.approx(0.6)
    assert (got.c_remote, got.c_local, got.split_share) == pytest.approx((8.0, 4.0, 1.0))


@pytest.mark.parametrize("alpha,rho_p", [(0.0, 6 / 8), (0.25, 6 / (4 * 2.5)), (0.5, 0.5), (1.0, 6 / 16)])
def test_rho_p_weights_local_prefill_workers_by_alpha(alpha, rho_p):
    assert loads("2xL4:E+P,2xL4:P,2xL4:D", 6, alpha).rho_p == pytest.approx(rho_p)


def test_local_prefill_alone_carries_prefill():
    # rho_P = Lambda / (C_P * n_L * alpha) = 2 / (4 * 1 * 0.5) = 1.0: at capacity.
    assert loads("1xL4:E+P,1xL4:D", 2).rho_p == pytest.approx(1.0)


def test_heterogeneous_stage_capacity_is_the_sum_of_its_workers():
    # rho_E = 6 / (10 + 20); rho_P = 6 / (4 + 8 + 0.5*8); rho_D = 6 / 10.
    got = loads("1xL4:E,1xH100:E+P,1xL4:P,1xH100:P,1xH100:D", 6)
    assert (got.rho_e, got.rho_p, got.rho_d) == pytest.approx((0.2, 0.375, 0.6))


def test_combined_workers_serve_whole_requests():
    # One P+D GPU of A does a request in 1/4 + 1/5 s: 20/9 req/s each; two of them at Lambda = 2.
    got = loads("2xL4:E,2xL4:P+D", 2)
    assert got.rho_p == got.rho_d == pytest.approx(2 / (2 * 20 / 9))
    assert got.split_share == 0.0 and got.c_remote == pytest.approx(40 / 9) and got.c_local == 0.0


def test_split_and_combined_paths_are_balanced():
    # Split path: S_P = 0.5*4 = 2 (local only), S_D = 5 -> bottleneck 2; combined: 1/(1/8 + 1/10) = 40/9.
    # f = 2 / (2 + 40/9); every busy stage then runs at Lambda / (2 + 40/9).
    got = loads("1xL4:E+P,1xL4:D,1xH100:P+D", 6)
    f = 2 / (2 + 40 / 9)
    assert got.split_share == pytest.approx(f)
    assert got.rho_p == pytest.approx(6 / (2 + 40 / 9))
    assert got.rho_d == pytest.approx(6 / (2 + 40 / 9))     # combined path is the busier decode
    assert got.rho_e == pytest.approx(6 / 10)
    assert (got.c_remote, got.c_local) == pytest.approx((40 / 9, 2.0))


def test_a_stage_without_capacity_is_infinitely_loaded():
    caps = {**CAPS, A: CAPS[A].model_copy(update={"decode": 0.0})}
    assert math.isinf(stage_loads(parse_allocation("1xL4:E,1xL4:P,1xL4:D"), 1, caps, 0.5).rho_d)


def test_unlimited_decode_when_requests_need_no_decode_step():
    caps = {A: CAPS[A].model_copy(update={"decode": math.inf})}
    got = stage_loads(parse_allocation("1xL4:E,1xL4:P+D"), 2, caps, 0.5)
    assert got.rho_p == pytest.approx(0.5) and got.rho_d == pytest.approx(0.5)
    assert stage_loads(parse_allocation("1xL4:E,1xL4:P,1xL4:D"), 2, caps, 0.5).rho_d == 0.0


def test_stage_loads_input_errors():
    with pytest.raises(ValueError, match="arrival rate must be > 0"):
        loads("1xL4:E,1xL4:P+D", 0)
    with pytest.raises(ValueError, match="alpha .* must be in \\[0, 1\\], got 1.5"):
        loads("1xL4:E,1xL4:P+D", 1, alpha=1.5)
    with pytest.raises(KeyError, match="no capacities for tier 'A10G'"):
        loads("1xA10G:E,1xL4:P+D", 1)


@pytest.mark.parametrize("rate,n_e,expected", [(5, 2, 3), (4, 2, 2), (0.5, 3, 1), (10, 3, 4), (6, 1, 6)])
def test_b_max_is_ceil_rate_over_encoders(rate, n_e, expected):
    assert b_max(rate, n_e) == expected


def test_b_max_needs_an_encoder():
    with pytest.raises(ValueError, match="n_encode must be >= 1"):
        b_max(5, 0)


@pytest.mark.parametrize("c_remote,c_local,window", [
    (8, 4, (2 / 3 - 0.2, 2 / 3 + 0.2, 2 / 3)),
    (9, 1, (0.7, 1.0, 0.9)),          # clipped above
    (1, 9, (0.0, 0.3, 0.1)),          # clipped below
    (5, 0, (0.0, 0.0, 0.0)),          # no local prefill: s is moot
])
def test_s_window_centres_on_s_star(c_remote, c_local, window):
    assert s_window(c_remote, c_local) == pytest.approx(window)


def test_s_window_half_width_is_configurable():
    assert s_window(1, 1, half_width=0.1) == pytest.approx((0.4, 0.6, 0.5))


# --- stage 1 filters -------------------------------------------------------------------------------

# Lambda = 2. One E GPU of A (rho_E = 0.2) plus n P+D GPUs of A (rho = 2 / (n * 20/9) = 0.9 / n):
# scores n=1: 0.9, n=2: 0.45, n=3: 0.3, n=4: 0.225, n=5: max(0.2, 0.18) = 0.2. And one at exactly
# rho_P = 1: rho_P = 2 / (4 * (0 + 1 * 0.5)) = 1.0 (an E+P GPU alone; an extra E GPU would need a P or P+D).
LADDER = [f"1xL4:E,{n}xL4:P+D" for n in range(1, 6)] + ["1xL4:E+P,1xL4:D"]


def run_stage1(catalog, config=None, specs=LADDER, rate=2.0):
    return stage1([parse_allocation(s) for s in specs], rate, CAPS, catalog, config)


def test_filters_drop_overloaded_prune_beyond_slack_and_keep_top_k(catalog):
    result = run_stage1(catalog)
    assert (result.considered, result.feasible) == (6, 5)          # rho_P = 1.0 is dropped: rho >= 1
    # best 0.2; 1.2 x 0.2 = 0.24 keeps 0.2 and 0.225 only.
    assert result.within_slack == 2
    assert [c.allocation.label() for c in result.candidates] == ["1xL4:E,5xL4:P+D", "1xL4:E,4xL4:P+D"]
    assert [c.rank_value for c in result.candidates] == pytest.approx([0.2, 0.225])


def test_top_k_truncates_when_slack_lets_more_through(catalog):
    result = run_stage1(catalog, Stage1Config(slack=5.0))
    assert result.within_slack == 5
    assert [c.loads.score for c in result.candidates] == pytest.approx([0.2, 0.225, 0.3])
    assert len(run_stage1(catalog, Stage1Config(slack=5.0, top_k=1)).candidates) == 1


def test_candidates_carry_b_max_and_the_s_window(catalog):
    specs = ["2xL4:E,2xL4:E+P,2xL4:P,2xL4:D"]
    (cand,) = run_stage1(catalog, specs=specs, rate=6.0).candidates
    assert cand.b_max == 2                                  # ceil(6 / 4 encode GPUs)
    assert cand.s_star == pytest.approx(8 / 12)             # C_remote = 8, C_local = 0.5 * 2 * 4 = 4
    assert cand.s_range == pytest.approx((8 / 12 - 0.2, 8 / 12 + 0.2))
    assert cand.cost_per_hour == pytest.approx(8 * 0.81)


def test_rank_by_cost_prefers_cheaper_capacity(catalog):
    # Same shape on L4 ($0.81) and H100 ($4.92): the H100 layout scores lower (twice the capacity)
    # but costs 6x as much, so cost ranking flips the order.
    specs = ["1xL4:E,3xL4:P+D", "1xH100:E,3xH100:P+D"]
    by_score = run_stage1(catalog, Stage1Config(slack=10), specs)
    by_cost = run_stage1(catalog, Stage1Config(slack=10, rank_by="cost"), specs)
    assert by_score.candidates[0].allocation.label() == "1xH100:E,3xH100:P+D"
    assert by_cost.candidates[0].allocation.label() == "1xL4:E,3xL4:P+D"
    assert by_cost.candidates[0].rank_value == pytest.approx(0.3 * 4 * 0.81)


def test_nothing_feasible_gives_no_candidates(catalog):
    result = run_stage1(catalog, rate=100.0)
    assert result.candidates == () and result.feasible == 0 and result.considered == 6


def test_end_to_end_on_the_roofline_for_heteroserve_inventory(catalog):
    arch = PRESETS["llava-1.5-7b"]
    shape = RequestShape(modality="image", media_tokens=576, text_tokens=100, output_tokens=128)
    inventory = parse_inventory("2xRTX4090,2xA100", catalog)
    caps = capacities(PerfModel(catalog, arch), catalog, arch, inventory, shape)
    allocs = enumerate_inventory(inventory, host_check(catalog, arch, shape))
    result = stage1(allocs, 5.0, caps, catalog)
    assert 1 <= len(result.candidates) <= 3 and result.feasible <= result.considered == len(allocs)
    scores = [c.loads.score for c in result.candidates]
    assert scores == sorted(scores) and scores[-1] <= 1.2 * scores[0] and scores[-1] < 1
    assert all(1 <= c.b_max <= 5 and 0 <= c.s_range[0] <= c.s_range[1] <= 1 for c in result.candidates)
