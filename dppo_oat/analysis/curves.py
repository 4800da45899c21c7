"""Curves from the long table: Gaussian smoothing (the paper's σ = 2) and mean ± band across seeds."""

from __future__ import annotations

from typing import Sequence, TypeVar, Union

import numpy as np
import pandas as pd
from scipy.ndimage import gaussian_filter1d

from dppo_oat.analysis.runs import RUN_COLUMNS

BANDS = ("std", "minmax", "none")
"""Seed bands of :func:`aggregate_seeds`: mean ± standard deviation, min to max, or none (lo = hi = mean)."""

SeriesLike = TypeVar("SeriesLike", pd.Series, np.ndarray)
GroupBy = Union[str, Sequence[str]]


def smooth(series: SeriesLike, sigma: float = 2.0) -> SeriesLike:
    """Gaussian smoothing along the points of ``series`` (``scipy.ndimage.gaussian_filter1d``, reflected ends).

    ``sigma`` is in points (logged steps), as in the paper's figures; ``sigma <= 0`` returns the values unchanged.
    A pandas Series keeps its index and name. NaNs are left in place and do not spread: the other points are
    smoothed as one curve.
    """
    values = np.asarray(series, dtype=float)
    finite = np.isfinite(values)
    smoothed = values.copy()
    if sigma > 0 and finite.any():
        smoothed[finite] = gaussian_filter1d(values[finite], sigma)
    if isinstance(series, pd.Series):
        return pd.Series(smoothed, index=series.index, name=series.name)
    return smoothed


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
        band: ``std`` (mean ± std across runs, 0 for one run), ``minmax`` or ``none``.

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
    lo_hi = {"std": (stats["mean"] - stats["std"], stats["mean"] + stats["std"]),
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
