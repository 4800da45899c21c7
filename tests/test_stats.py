"""Paired comparisons and survival-aware time to threshold, against hand-computed cases and properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dppo_oat.analysis.stats import paired_difference, sample_std, time_to_threshold, verdict

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
    assert verdict(result) == "inconclusive"


def test_a_clear_difference_holds_and_its_reverse_is_refuted():
    rng = np.random.default_rng(0)
    right = rng.uniform(0.2, 0.4, 8)
    left = right + 0.3 + rng.normal(0, 0.02, 8)
    result = paired_difference(left, right)
    assert verdict(result, margin=0.1) == "holds" and result.p_value < 0.01
    assert verdict(paired_difference(right, left), margin=0.1) == "refuted"
    assert verdict(result, margin=0.5) == "inconclusive"


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
        verdict(paired_difference([1, 2], [0, 0.5]), margin=-1)


def test_sample_std_uses_ddof_1():
    assert sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2)) and math.isnan(sample_std([1.0]))
