"""Paired comparisons and survival-aware time to threshold, against hand-computed cases and properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat.analysis.stats import (
    MarginTests,
    decide,
    holm,
    interval_coverage,
    margin_tests,
    paired_difference,
    sample_std,
    time_to_threshold,
)

seeds_values = st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=3, max_size=10)


def test_kaplan_meier_without_censoring_is_the_empirical_median_and_mean():
    result = time_to_threshold([10, 20, 30, 40], 40)
    assert result.median == 20 and result.restricted_mean == pytest.approx(25) and result.reached == 4


def test_runs_that_never_reach_the_threshold_are_censored_not_dropped():
    """S(10) = 3/4, S(30) = 3/4 · (1 − 1/3) = 1/2: median 30, restricted mean 10 + 0.75·20 + 0.5·20 = 35.
    The median over only the runs that got there would say 20."""
    result = time_to_threshold([10, float("nan"), 30, float("nan")], 50)
    assert result.median == 30 and result.restricted_mean == pytest.approx(35)
    assert (result.reached, result.runs) == (2, 4)


def test_a_threshold_nobody_reaches_has_no_median_and_the_whole_horizon():
    result = time_to_threshold([float("nan")] * 3, [40, 50, 60])
    assert math.isnan(result.median) and result.restricted_mean == 60 and result.reached == 0


def test_identical_arms_differ_by_exactly_nothing():
    result = paired_difference([0.3, 0.5, 0.4], [0.3, 0.5, 0.4])
    assert (result.mean, result.low, result.high, result.p_value) == (0, 0, 0, 1.0)
    assert result.identical and decide(margin_tests(result, 0.0)) == "inconclusive"


def test_a_clear_difference_holds_and_its_reverse_is_refuted():
    rng = np.random.default_rng(0)
    right = rng.uniform(0.2, 0.4, 8)
    left = right + 0.3 + rng.normal(0, 0.02, 8)
    result = paired_difference(left, right)
    assert decide(margin_tests(result, 0.1)) == "holds" and result.p_value < 0.01
    assert decide(margin_tests(paired_difference(right, left), 0.1)) == "refuted"
    assert decide(margin_tests(result, 0.5)) == "equivalent"  # a difference near 0.3 is inside ±0.5


@settings(max_examples=25, deadline=None)
@given(seeds_values, st.floats(-0.5, 0.5, allow_nan=False))
def test_the_interval_holds_the_mean_and_moves_with_a_shift(values, shift):
    left = np.array(values, dtype=float)
    right = left[::-1] * 0.5
    base = paired_difference(left, right, resamples=999)
    moved = paired_difference(left + shift, right, resamples=999)
    assert base.low - 1e-12 <= base.mean <= base.high + 1e-12
    assert moved.mean == pytest.approx(base.mean + shift, abs=1e-9)
    if np.ptp(left - right) > 0:
        assert (moved.low, moved.high) == pytest.approx((base.low + shift, base.high + shift), abs=1e-9)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        paired_difference([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        paired_difference([1], [2])
    with pytest.raises(ValueError):
        margin_tests(paired_difference([1, 2], [0, 0.5]), margin=-1)


def test_sample_std_uses_ddof_1():
    assert sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2)) and math.isnan(sample_std([1.0]))


def test_the_t_interval_is_mean_plus_minus_t_quantile_times_standard_error():
    """d = 0.1, 0.2, 0.15, 0.12, 0.3: mean 0.174, sample sd 0.079875, se 0.035721; t(0.975, 4) = 2.776445, so the
    95% interval is 0.174 ± 0.099178 = [0.074822, 0.273178]."""
    result = paired_difference([0.1, 0.2, 0.15, 0.12, 0.3], [0, 0, 0, 0, 0])
    assert result.method == "t" and result.mean == pytest.approx(0.174)
    assert (result.low, result.high) == pytest.approx((0.074822, 0.273178), abs=2e-6)


def test_holm_multiplies_the_ith_smallest_by_m_minus_i_plus_one_and_keeps_the_order():
    """Sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → running max 0.02, 0.03, 0.06,
    0.06; NaN is outside the family (m = 4)."""
    adjusted = holm([0.01, 0.04, float("nan"), 0.03, 0.005])
    assert adjusted[[0, 1, 3, 4]] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[2])
    assert holm([0.9, 0.8]).tolist() == [1.0, 1.0]


def test_margin_tests_read_a_claim_its_reverse_and_equivalence():
    ahead = paired_difference([0.50, 0.52, 0.49, 0.51, 0.50], [0.30, 0.31, 0.30, 0.29, 0.30])
    assert decide(margin_tests(ahead, 0.02)) == "holds"
    assert decide(margin_tests(paired_difference(ahead_right := [0.30, 0.31, 0.30, 0.29, 0.30],
                                                 [0.50, 0.52, 0.49, 0.51, 0.50]), 0.02)) == "refuted"
    close = paired_difference([0.301, 0.299, 0.300, 0.302, 0.298], ahead_right)
    assert decide(margin_tests(close, 0.05)) == "equivalent"
    assert decide(margin_tests(close, 0.0)) == "inconclusive"  # no equivalence within a margin of nothing


def test_tost_is_the_95_percent_interval_inside_the_margin():
    """At one-sided level 0.025 the two one-sided tests reject exactly when the two-sided 95% t-interval lies
    inside ±margin."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        d = rng.normal(rng.uniform(-0.03, 0.03), rng.uniform(0.001, 0.03), 6)
        result = paired_difference(d, np.zeros(6))
        inside = -0.02 < result.low and result.high < 0.02
        assert (margin_tests(result, 0.02).equivalent < 0.025) == inside
        assert (margin_tests(result, 0.02).above < 0.025) == (result.low > 0.02)


def test_identical_runs_are_named_as_such():
    same = paired_difference([0.3, 0.5, 0.4], [0.3, 0.5, 0.4])
    shifted = paired_difference([0.5, 0.75, 0.25], [0.25, 0.5, 0.0])  # +0.25 exactly, every pair
    assert same.identical and not shifted.identical
    assert margin_tests(shifted, 0.05) == MarginTests(above=0.0, below=1.0, equivalent=1.0)


def test_the_t_interval_covers_its_nominal_level_where_the_percentile_bootstrap_does_not():
    """The audit's finding, simulated: at 5 pairs of normal differences the percentile bootstrap's "95%" interval
    covers about 84%; the t interval about 95% (2000 draws: ±0.01 is two standard errors)."""
    assert interval_coverage(5, "t", simulations=2000) == pytest.approx(0.95, abs=0.015)
    assert interval_coverage(5, "percentile", simulations=300) < 0.90


def test_an_unknown_interval_method_is_refused():
    with pytest.raises(ValueError, match="method"):
        paired_difference([1, 2], [0, 0], method="wald")
