"""Statistics for comparing methods over seeds: paired differences with bootstrap CIs and permutation tests,
verdicts against a margin fixed before the runs, and survival-aware time to a threshold.

The study's arms share seeds (same warm start, same puzzles per seed), so a claim "A beats B" is about the per-seed
differences A − B: :func:`paired_difference` gives their mean, a bootstrap confidence interval and a two-sided paired
permutation p-value (``scipy.stats.bootstrap`` / ``permutation_test``). :func:`verdict` reads a claim off the
interval and a margin written down ahead of time. A run that never reaches a threshold is right-censored at its last
step, not dropped: :func:`time_to_threshold` is the Kaplan-Meier median (``scipy.stats.ecdf`` on censored data) and
the restricted mean time to threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedDifference:
    """Mean of the per-seed differences ``left − right``, its CI and the paired permutation p-value."""

    mean: float
    low: float
    high: float
    p_value: float
    pairs: int
    confidence: float


def paired_difference(left: Sequence[float], right: Sequence[float], *, confidence: float = 0.95,
                      resamples: int = 9999, seed: int = 0) -> PairedDifference:
    """``left[i] − right[i]`` over paired seeds: mean, percentile bootstrap CI, two-sided permutation p-value
    (signs of the differences flipped at random; exact when 2^pairs ≤ ``resamples``)."""
    left, right = np.asarray(left, dtype=float), np.asarray(right, dtype=float)
    if left.shape != right.shape or left.ndim != 1:
        raise ValueError(f"paired samples need the same 1-D shape, got {left.shape} and {right.shape}")
    if len(left) < 2 or not (np.isfinite(left).all() and np.isfinite(right).all()):
        raise ValueError("paired samples need at least 2 finite pairs")
    differences = left - right
    mean = float(differences.mean())
    if np.ptp(differences) == 0:  # every pair differs by the same amount: nothing to resample
        return PairedDifference(mean, mean, mean, 1.0 if mean == 0 else 0.0, len(left), confidence)
    rng = np.random.default_rng(seed)
    interval = stats.bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=resamples,
                               method="percentile", random_state=rng).confidence_interval
    test = stats.permutation_test((left, right), lambda a, b: np.mean(a - b), permutation_type="samples",
                                  n_resamples=resamples, alternative="two-sided", random_state=rng)
    return PairedDifference(mean, float(interval.low), float(interval.high), float(test.pvalue), len(left),
                            confidence)


def verdict(difference: PairedDifference, margin: float = 0.0) -> str:
    """``holds`` when the whole CI is above ``margin``, ``refuted`` when it is below ``−margin``, else
    ``inconclusive`` (the claim being ``left − right > margin``; the margin is fixed before the runs)."""
    if margin < 0:
        raise ValueError(f"the margin must be >= 0, got {margin}")
    if difference.low > margin:
        return "holds"
    if difference.high < -margin:
        return "refuted"
    return "inconclusive"


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
