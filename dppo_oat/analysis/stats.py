"""Statistics for comparing methods over seeds: paired differences with intervals of known coverage, one-sided and
equivalence tests against a margin fixed before the runs, Holm's correction over a family of claims, and
survival-aware time to a threshold.

The study's arms share seeds (same warm start, same puzzles per seed), so a claim "A beats B" is about the per-seed
differences A − B. :func:`paired_difference` gives their mean and a confidence interval: Student's t by default,
whose coverage at 5–10 pairs of roughly normal differences is its nominal level, where a percentile bootstrap over 5
pairs covers about 84% (:func:`interval_coverage` simulates either). :func:`margin_tests` tests the claim against the
margin (one-sided t-tests) and the two arms' equivalence within it (two one-sided tests, TOST); :func:`holm` adjusts
a family's p-values; :func:`decide` reads the verdict. A run that never reaches a threshold is right-censored at its
last step, not dropped: :func:`time_to_threshold` is the Kaplan-Meier median (``scipy.stats.ecdf`` on censored data)
and the restricted mean time to threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

INTERVAL_METHODS = ("t", "bca", "percentile")
"""``t``: Student's t interval of the mean difference; ``bca`` / ``percentile``: ``scipy.stats.bootstrap``'s."""
ONE_SIDED_ALPHA = 0.025
"""Level of each one-sided test: a single claim holds exactly when its two-sided 95% t-interval lies above the margin,
and two arms are equivalent exactly when that interval lies inside ±margin."""


@dataclass(frozen=True)
class PairedDifference:
    """Mean of the per-seed differences ``left − right``, its CI (by ``method``), a two-sided p-value of "no
    difference" (the t-test's, or a paired permutation test's for the bootstrap methods), and the differences."""

    mean: float
    low: float
    high: float
    p_value: float
    pairs: int
    confidence: float
    method: str = "t"
    differences: tuple[float, ...] = ()

    @property
    def identical(self) -> bool:
        """Every pair differs by exactly nothing: the two arms ran the same computation."""
        return bool(self.differences) and not any(self.differences)


def _no_spread(differences: np.ndarray) -> bool:
    """Every pair differs by the same amount, up to float rounding of means over a run's steps."""
    return bool(np.ptp(differences) <= 1e-12 * max(1.0, float(np.abs(differences).max())))


def _checked_pairs(left: Sequence[float], right: Sequence[float]) -> np.ndarray:
    left, right = np.asarray(left, dtype=float), np.asarray(right, dtype=float)
    if left.shape != right.shape or left.ndim != 1:
        raise ValueError(f"paired samples need the same 1-D shape, got {left.shape} and {right.shape}")
    if len(left) < 2 or not (np.isfinite(left).all() and np.isfinite(right).all()):
        raise ValueError("paired samples need at least 2 finite pairs")
    return left - right


def paired_difference(left: Sequence[float], right: Sequence[float], *, confidence: float = 0.95,
                      method: str = "t", resamples: int = 9999, seed: int = 0) -> PairedDifference:
    """``left[i] − right[i]`` over paired seeds: mean, CI and two-sided p-value. ``method`` ``t``: the t interval and
    one-sample t-test; ``bca``/``percentile``: that bootstrap interval and a paired permutation test (signs flipped
    at random; exact when 2^pairs ≤ ``resamples``)."""
    if method not in INTERVAL_METHODS:
        raise ValueError(f"method must be one of {INTERVAL_METHODS}, got {method!r}")
    differences = _checked_pairs(left, right)
    mean, kept = float(differences.mean()), tuple(float(d) for d in differences)
    if _no_spread(differences):  # every pair differs by the same amount: no spread to estimate
        return PairedDifference(mean, mean, mean, 1.0 if mean == 0 else 0.0, len(kept), confidence, method, kept)
    if method == "t":
        test = stats.ttest_1samp(differences, 0.0)
        interval = test.confidence_interval(confidence)
        return PairedDifference(mean, float(interval.low), float(interval.high), float(test.pvalue), len(kept),
                                confidence, method, kept)
    rng = np.random.default_rng(seed)
    interval = stats.bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=resamples,
                               method=method, random_state=rng).confidence_interval
    test = stats.permutation_test((differences,), np.mean, permutation_type="samples", n_resamples=resamples,
                                  alternative="two-sided", random_state=rng)
    return PairedDifference(mean, float(interval.low), float(interval.high), float(test.pvalue), len(kept),
                            confidence, method, kept)


@dataclass(frozen=True)
class MarginTests:
    """One-sided p-values of a claim ``left − right > margin``: ``above`` (the claim), ``below`` (its reverse,
    ``left − right < −margin``) and ``equivalent`` (TOST: ``|left − right| < margin``, the larger of its two
    one-sided p-values)."""

    above: float
    below: float
    equivalent: float


def _one_sided_p(differences: np.ndarray, bound: float, alternative: str) -> float:
    """p-value of the t-test of "mean > bound" (``greater``) or "mean < bound" (``less``); 0 or 1 without spread."""
    if _no_spread(differences):
        mean = float(differences.mean())
        return 0.0 if (mean > bound if alternative == "greater" else mean < bound) else 1.0
    return float(stats.ttest_1samp(differences, bound, alternative=alternative).pvalue)


def margin_tests(difference: PairedDifference, margin: float) -> MarginTests:
    """The claim, its reverse and the arms' equivalence against ``margin``, each by one-sided t-tests on the paired
    differences."""
    if margin < 0:
        raise ValueError(f"the margin must be >= 0, got {margin}")
    d = np.asarray(difference.differences, dtype=float)
    if len(d) < 2:
        raise ValueError("margin tests need the paired differences (at least 2)")
    above = _one_sided_p(d, margin, "greater")
    below = _one_sided_p(d, -margin, "less")
    equivalent = max(_one_sided_p(d, -margin, "greater"), _one_sided_p(d, margin, "less"))
    return MarginTests(above, below, equivalent)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment of a family's p-values (NaN entries are not part of the family and stay NaN):
    the i-th smallest of m becomes max over j ≤ i of (m − j + 1)·p_(j), capped at 1."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    present = np.flatnonzero(~np.isnan(p))
    order = present[np.argsort(p[present], kind="stable")]
    m = len(order)
    steps = (m - np.arange(m)) * p[order]
    adjusted[order] = np.minimum(np.maximum.accumulate(steps), 1.0)
    return adjusted


def decide(tests: MarginTests, alpha: float = ONE_SIDED_ALPHA) -> str:
    """``holds`` (the claim's test rejects), ``refuted`` (its reverse rejects), ``equivalent`` (TOST rejects: the
    arms differ by less than the margin), else ``inconclusive``; pass Holm-adjusted p-values for a family."""
    if tests.above < alpha:
        return "holds"
    if tests.below < alpha:
        return "refuted"
    if tests.equivalent < alpha:
        return "equivalent"
    return "inconclusive"


def interval_coverage(pairs: int, method: str = "t", *, confidence: float = 0.95, simulations: int = 2000,
                      resamples: int = 999, seed: int = 0,
                      draw: Callable[[np.random.Generator, int], np.ndarray] | None = None) -> float:
    """Share of ``simulations`` samples of ``pairs`` differences whose ``method`` interval contains the true mean:
    the interval's real coverage at that seed count. ``draw(rng, n)`` gives the differences (default: standard
    normal, true mean 0; a custom draw must also have mean 0)."""
    rng = np.random.default_rng(seed)
    draw = draw or (lambda generator, n: generator.standard_normal(n))
    covered = 0
    for i in range(simulations):
        differences = draw(rng, pairs)
        result = paired_difference(differences, np.zeros(pairs), confidence=confidence, method=method,
                                   resamples=resamples, seed=seed + i)
        covered += result.low <= 0.0 <= result.high
    return covered / simulations


@dataclass(frozen=True)
class TimeToThreshold:
    """Kaplan-Meier median steps to a threshold (NaN when fewer than half the runs are known to reach it), the
    restricted mean over ``[0, horizon]``, and how many runs reached it."""

    median: float
    restricted_mean: float
    reached: int
    runs: int


def time_to_threshold(first_steps: Sequence[float], last_steps: Sequence[float] | float) -> TimeToThreshold:
    """Runs' first step at the threshold (NaN: never), each censored at its last step when it never got there.
    ``last_steps``: one per run, or one for all; the horizon of the restricted mean is the largest."""
    first = np.asarray(first_steps, dtype=float)
    last = np.broadcast_to(np.asarray(last_steps, dtype=float), first.shape)
    if first.ndim != 1 or len(first) == 0:
        raise ValueError("time_to_threshold needs a 1-D, non-empty sequence of runs")
    reached = np.isfinite(first)
    horizon = float(last.max())
    if not reached.any():
        return TimeToThreshold(float("nan"), horizon, 0, len(first))
    data = stats.CensoredData(uncensored=first[reached], right=last[~reached])
    survival = stats.ecdf(data).sf
    times = np.concatenate([[0.0], survival.quantiles, [horizon]])
    probabilities = np.concatenate([[1.0], survival.probabilities])
    below_half = np.nonzero(probabilities <= 0.5)[0]
    median = float(times[below_half[0]]) if len(below_half) else float("nan")
    widths = np.diff(np.clip(times, 0.0, horizon))
    restricted_mean = float(np.sum(probabilities * widths))
    return TimeToThreshold(median, restricted_mean, int(reached.sum()), len(first))


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (ddof = 1) of a few seeds; NaN for fewer than 2."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")
