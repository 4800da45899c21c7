"""Curves from the long table: smoothed (:func:`~dppo_oat.analysis.smoothing.smooth`, the paper's σ = 2), mean ± band
across seeds, and what each method's curve did."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dppo_oat.analysis.degenerate import curve_flags
from dppo_oat.analysis.runs import RUN_COLUMNS
from dppo_oat.analysis.smoothing import smooth

BANDS = ("std", "minmax", "none")
"""Seed bands of :func:`aggregate_seeds`: mean ± standard deviation, min to max, or none (lo = hi = mean)."""

GroupBy = str | Sequence[str]


def metric_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of ``metric`` in the long table (empty when no run logs it)."""
    return df[df["metric"] == metric]


def aggregate_seeds(df: pd.DataFrame, metric: str, by: GroupBy = "method", band: str = "std") -> pd.DataFrame:
    """Mean of ``metric`` across the runs of each group, per step, with a band.

    Args:
        df: the long table of :func:`~dppo_oat.analysis.runs.load_runs`.
        metric: a metric name, e.g. ``"reward"`` or ``"eval/success"``.
        by: the column(s) naming a group: ``method`` (a preset and its settings, per environment: its runs are
            the seeds), ``algo`` (the preset alone, pooling settings and environments), ``label`` or ``run``
            (one curve per run), or any other run column.
        band: ``std`` (mean ± std across runs, 0 for one run, clipped to the smallest and largest value of the
            metric in ``df``: it never leaves the metric's range), ``minmax`` or ``none``.

    Returns:
        One row per group and step, sorted: the ``by`` column(s), ``step``, ``mean``, ``lo``, ``hi``, ``std``,
        ``min``, ``max`` and ``n`` (how many runs logged that step). Groups keep their order of appearance.
    """
    if band not in BANDS:
        raise ValueError(f"unknown band {band!r}; choose one of: {', '.join(BANDS)}")
    keys = [by] if isinstance(by, str) else list(by)
    unknown = [key for key in keys if key not in df.columns]
    if unknown:
        raise ValueError(f"cannot group by {unknown}: the table's run columns are {', '.join(RUN_COLUMNS)}")
    rows = metric_rows(df, metric)
    grouped = rows.groupby([*keys, "step"], sort=False, dropna=False)["value"]
    stats = grouped.agg(["mean", "std", "min", "max", "count"])
    stats = stats.rename(columns={"count": "n"}).reset_index()
    stats["std"] = stats["std"].fillna(0.0)
    # mean ± std within the range the metric took in the table: a band never shows values the metric cannot take
    # (a success rate's stays in [0, 1], where two seeds' std alone would reach past both of them)
    low, high = rows["value"].min(), rows["value"].max()
    lo_hi = {"std": ((stats["mean"] - stats["std"]).clip(lower=low), (stats["mean"] + stats["std"]).clip(upper=high)),
             "minmax": (stats["min"], stats["max"]), "none": (stats["mean"], stats["mean"])}[band]
    stats["lo"], stats["hi"] = lo_hi
    order = {key: position for position, key in enumerate(_group_keys(rows, keys))}
    stats["_order"] = [order[key] for key in _group_keys(stats, keys, unique=False)]
    stats = stats.sort_values(["_order", "step"], kind="stable").drop(columns="_order").reset_index(drop=True)
    return stats[[*keys, "step", "mean", "lo", "hi", "std", "min", "max", "n"]]


def _group_keys(table: pd.DataFrame, keys: list[str], unique: bool = True) -> list:
    """The group key of every row of ``table`` (a value for one key column, a tuple for several)."""
    values = list(table[keys[0]]) if len(keys) == 1 else list(table[keys].itertuples(index=False, name=None))
    return list(dict.fromkeys(values)) if unique else values


def group_order(df: pd.DataFrame, by: GroupBy) -> list:
    """The groups of ``df`` in order of first appearance (the legend order)."""
    keys = [by] if isinstance(by, str) else list(by)
    return _group_keys(df, keys)


COLLAPSE_DROP = 0.1
"""A method whose smoothed mean reward ends this far or more below its peak has fallen back (the paper's collapse)."""
MISMATCH_GROWTH = 1.5
"""A method whose mean |π − μ| over its last tenth is this many times that of its first tenth shows a growing
mismatch (the paper's Takeaway 1)."""


def _ends(curve: pd.Series, share: float = 0.1) -> tuple[float, float]:
    """The means of the first and of the last ``share`` of ``curve``'s points (at least one each)."""
    count = max(1, round(share * len(curve)))
    return float(curve.head(count).mean()), float(curve.tail(count).mean())


COMPARED = ("reward", "mismatch/abs_diff_mean", "bad_update/fraction", "mask/fraction")
"""The metrics :func:`compare_methods` reads."""


def compare_methods(df: pd.DataFrame, by: str = "method", sigma: float = 2.0) -> pd.DataFrame:
    """What each curve of ``df`` did, from its seed-mean curves (smoothed with ``sigma``): the final reward (mean
    of the last tenth), its peak and the drop from it, |π − μ| over the first and last tenth, and the mean share of
    bad updates and of masked tokens (%). NaN where its runs do not log the metric. ``flag``: why the curve cannot
    be read as a trust region (:func:`~dppo_oat.analysis.degenerate.curve_flags`), empty when it can."""

    flags = curve_flags(df, by)
    means = {metric: aggregate_seeds(df, metric, by=by) for metric in COMPARED}
    rows = []
    for group in group_order(df, by):
        curves = {metric: smooth(mean.loc[mean[by] == group, "mean"].reset_index(drop=True), sigma)
                  for metric, mean in means.items()}
        reward, mismatch = curves["reward"], curves["mismatch/abs_diff_mean"]
        final = _ends(reward)[1] if len(reward) else np.nan
        peak = float(reward.max()) if len(reward) else np.nan
        start, end = _ends(mismatch) if len(mismatch) else (np.nan, np.nan)
        rows.append({"curve": group, "final reward": final, "peak reward": peak, "drop from peak": peak - final,
                     "|π−μ| first tenth": start, "|π−μ| last tenth": end,
                     "bad updates %": 100 * curves["bad_update/fraction"].mean(),
                     "masked %": 100 * curves["mask/fraction"].mean(), "flag": flags.get(group, "")})
    return pd.DataFrame(rows).set_index("curve")


def comparison_notes(table: pd.DataFrame) -> list[str]:
    """Sentences on what the runs of :func:`compare_methods` show, for a reader to hold against the paper's
    findings: which curve ends highest, which fell back from its peak, whose |π − μ| grew, which masked most, and
    which curves are flagged (their rule cannot be read as a trust region)."""
    notes = []
    rewards = table["final reward"].dropna().sort_values(ascending=False)
    if len(rewards) > 1:
        notes.append("final reward, highest first: "
                     + ", ".join(f"{name} {value:.3f}" for name, value in rewards.items()))
    fell = table.index[table["drop from peak"] >= COLLAPSE_DROP].tolist()
    notes.append(f"reward fell {COLLAPSE_DROP} or more below its peak: {', '.join(map(str, fell))}" if fell else
                 f"no curve's reward fell {COLLAPSE_DROP} or more below its peak (no collapse in these runs)")
    ratio = table["|π−μ| last tenth"] / table["|π−μ| first tenth"]
    grew = ratio.index[ratio >= MISMATCH_GROWTH].tolist()
    if ratio.notna().any():
        notes.append(f"|π − μ| grew {MISMATCH_GROWTH}× or more from the first to the last tenth: "
                     f"{', '.join(map(str, grew))}" if grew else
                     f"|π − μ| grew less than {MISMATCH_GROWTH}× for every curve")
    masked = table["masked %"].dropna().sort_values(ascending=False)
    if len(masked) > 1:
        notes.append("masked tokens, most first: "
                     + ", ".join(f"{name} {value:.2f} %" for name, value in masked.items()))
    flagged = table["flag"][table["flag"] != ""] if "flag" in table else pd.Series(dtype=str)
    if len(flagged):
        notes.append("flagged curves (their rule cannot be read as a trust region): "
                     + "; ".join(f"{name}: {flag}" for name, flag in flagged.items()))
    return notes
