"""Gaussian smoothing of a curve, as the paper's figures smooth theirs (σ = 2 logged steps)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pandas as pd
from scipy.ndimage import gaussian_filter1d

SeriesLike = TypeVar("SeriesLike", pd.Series, np.ndarray)


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
