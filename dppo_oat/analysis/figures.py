"""Figures like the paper's: one panel per metric, every method overlaid, smoothed curves over the raw ones.

Curves are Gaussian-smoothed (σ = 2 logged steps by default) with the raw curve drawn faintly behind; with several
seeds per method the curve is their mean and a shaded band their spread. Colours name methods (one legend for the
figure), line styles name the series of a multi-metric panel (a small key inside it). The figures are plain
:class:`matplotlib.figure.Figure` objects: no pyplot state, any backend (``savefig`` renders PNGs with Agg).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from dppo_oat.analysis.curves import GroupBy, aggregate_seeds, group_order, smooth
from dppo_oat.analysis.degenerate import curve_flags
from dppo_oat.analysis.panels import DEFAULT_PANELS, Panel, available_panels
from dppo_oat.analysis.runs import mixed_settings, mixed_settings_message, preset_name
from dppo_oat.analysis.tokens import MASKS

LINESTYLES = ("-", "--", ":", "-.")
RAW_ALPHA, BAND_ALPHA = 0.25, 0.15
PANEL_SIZE = (4.0, 3.0)
"""Width and height of one panel, in inches."""


def group_name(key, by: GroupBy) -> str:
    """Legend text of a group: the paper's name for a preset (``by="algo"``), else the key itself."""
    if by == "algo":
        return preset_name(str(key))
    if by == "seed":
        return f"seed {key}"
    return " · ".join(map(str, key)) if isinstance(key, tuple) else str(key)


def group_colors(df: pd.DataFrame, by: GroupBy) -> dict:
    """A colour per group, in order of appearance (tab10, tab20 beyond ten groups)."""
    groups = group_order(df, by)
    palette = matplotlib.colormaps["tab10" if len(groups) <= 10 else "tab20"].colors
    return {group: palette[i % len(palette)] for i, group in enumerate(groups)}


def panel_grid(count: int, ncols: int | None = None) -> tuple[int, int]:
    """Rows and columns for ``count`` panels: at most 4 columns unless ``ncols`` says otherwise."""
    ncols = ncols or min(count, 4 if count != 6 else 3)
    return math.ceil(count / ncols), ncols


def new_axes(count: int, ncols: int | None = None, panel_size=PANEL_SIZE) -> tuple[Figure, list[Axes]]:
    """A constrained-layout figure with a grid of ``count`` panels (extra grid cells hidden)."""
    nrows, ncols = panel_grid(count, ncols)
    fig = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows + 0.5), layout="constrained")
    axes = list(np.ravel(fig.subplots(nrows, ncols, squeeze=False)))
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count]


MIN_POINTS_TO_SMOOTH = 10
"""Curves with fewer logged points (e.g. a handful of evaluations) are drawn raw."""


def draw_curve(ax: Axes, curve: pd.DataFrame, color, linestyle: str, sigma: float, scale: float) -> None:
    """One group's curve: the raw mean faintly, its smoothing on top, and the smoothed seed band if it has one."""
    x = curve["step"].to_numpy()
    y = curve["mean"].to_numpy() * scale
    if len(x) < MIN_POINTS_TO_SMOOTH:
        sigma = 0.0  # a few evaluations: smoothing would pull the first and last points towards the middle
    marker = "." if len(x) <= 25 else None
    if sigma > 0:
        ax.plot(x, y, color=color, alpha=RAW_ALPHA, linewidth=0.8, linestyle=linestyle, marker=marker)
    ax.plot(x, smooth(y, sigma), color=color, linewidth=1.6, linestyle=linestyle,
            marker=marker if sigma <= 0 else None)
    if (curve["n"] > 1).any() and not curve["lo"].equals(curve["hi"]):
        lo, hi = (smooth(curve[c].to_numpy() * scale, sigma) for c in ("lo", "hi"))
        ax.fill_between(x, lo, hi, color=color, alpha=BAND_ALPHA, linewidth=0)


def draw_panel(ax: Axes, df: pd.DataFrame, panel: Panel, by: GroupBy, colors: dict, sigma: float, band: str) -> None:
    """Every group's curves of every series of ``panel`` on ``ax``, with title, labels and a line-style key."""
    scale = 100.0 if panel.percent else 1.0
    drawn = []
    for linestyle, series in zip(LINESTYLES, panel.series, strict=False):
        stats = aggregate_seeds(df, series.metric, by=by, band=band)
        if stats.empty:
            continue
        drawn.append(Line2D([], [], color="0.3", linestyle=linestyle, label=series.label or series.metric))
        for key, curve in stats.groupby(by, sort=False, dropna=False):
            key = key[0] if isinstance(key, tuple) and isinstance(by, str) else key
            draw_curve(ax, curve, colors[key], linestyle, sigma, scale)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, linewidth=0.5)
    if len(panel.series) > 1:
        ax.legend(handles=drawn, fontsize=7, frameon=False, handlelength=2.2)


LEGEND_ROW_HEIGHT = 0.22
"""Inches a legend row takes at fontsize 9 (the figure grows by that much per row, so panels keep their size)."""


def add_legend(fig: Figure, colors: dict, by: GroupBy, title: str | None = None, grow: bool = True,
               flags: dict | None = None) -> None:
    """One legend for the figure, above the panels: a colour per group, each named with its flag when it has one
    (``flags``: :func:`~dppo_oat.analysis.degenerate.curve_flags`), under the figure's title if any. As many
    columns as the figure's width allows; ``grow`` makes the figure taller by the legend's rows, so a legend of
    many runs never squeezes the panels out of the figure."""
    flags = flags or {}
    handles = [Line2D([], [], color=color, linewidth=2,
                      label=group_name(key, by) + (f": {flags[key]}" if key in flags else ""))
               for key, color in colors.items()]
    entry_width = 0.7 + 0.075 * max(len(handle.get_label()) for handle in handles)  # inches at fontsize 9
    ncols = min(len(handles), max(1, int(fig.get_figwidth() / entry_width)))
    if grow:
        fig.set_figheight(fig.get_figheight() + LEGEND_ROW_HEIGHT * math.ceil(len(handles) / ncols))
    fig.legend(handles=handles, loc="outside upper center", ncols=ncols, frameon=False, fontsize=9, title=title,
               title_fontproperties={"size": 12})


def plot_runs(
    df: pd.DataFrame,
    metrics: Iterable[str | Panel] = DEFAULT_PANELS,
    sigma: float = 2.0,
    by: GroupBy = "method",
    band: str = "std",
    ncols: int | None = None,
    axes: Sequence[Axes] | None = None,
    title: str | None = None,
) -> Figure:
    """Learning curves of the runs in ``df`` (the long table of ``load_runs``): one panel per metric.

    Args:
        metrics: panel names (:data:`~dppo_oat.analysis.panels.PANELS`), raw metric names, or :class:`Panel`
            objects. Panels no run has data for are skipped and named in a note under the figure.
        sigma: Gaussian smoothing in logged points (0: raw curves only).
        by: what one curve is (see :func:`~dppo_oat.analysis.curves.aggregate_seeds`): runs of a group are
            averaged, with a ``band`` (``std``, ``minmax`` or ``none``) across them. A ``method`` (or ``variant``)
            curve whose runs differ in a setting other than the seed is drawn with one warning naming the settings
            (:func:`warn_mixed_settings`). A curve whose rule cannot be read as a trust region (it blocked under
            0.1% or over 50% of the tokens, or most of its runs collapsed within 5 steps) is named in the legend
            with its flag (:func:`~dppo_oat.analysis.degenerate.curve_flags`).
        ncols: panels per row (default: up to 4). ``axes``: draw into these instead (one per kept panel).
        title: a title above the figure.

    Raises:
        ValueError: when none of ``metrics`` has data in ``df``, or ``axes`` are too few.
    """
    panels, skipped = available_panels(df, metrics)
    if not panels:
        raise ValueError(f"nothing to plot: {'; '.join(skipped) or 'no metrics asked for'}")
    warn_mixed_settings(df, by)
    created = axes is None
    if created:
        fig, axes = new_axes(len(panels), ncols)
    elif len(axes) < len(panels):
        raise ValueError(f"{len(panels)} panels to draw but {len(axes)} axes given")
    else:
        fig = axes[0].figure
    colors = group_colors(df, by)
    for ax, (_, panel) in zip(axes, panels, strict=False):
        draw_panel(ax, df, panel, by, colors, sigma, band)
    add_legend(fig, colors, by, title, grow=created, flags=curve_flags(df, by))
    if skipped:
        fig.supxlabel("Not plotted: " + "; ".join(skipped), fontsize=7, color="0.4")
    return fig


SEED_GROUPINGS = ("method", "variant")
"""The groupings whose curves average runs as seeds of one setting (``algo``, ``env`` and ``seed`` pool settings on
purpose; ``label`` and ``run`` draw one run per curve)."""

_warned: set[str] = set()
"""The mixed-settings warnings already given in this process (a notebook draws the same curves many times)."""


def warn_mixed_settings(df: pd.DataFrame, by: GroupBy) -> None:
    """Warn, once per curve and process, when a curve averages runs that differ in settings other than the seed
    (:func:`~dppo_oat.analysis.runs.mixed_settings`): they are plotted as seeds, which they are not."""
    if by not in SEED_GROUPINGS:
        return
    for group, differing in mixed_settings(df, by).items():
        message = mixed_settings_message(group_name(group, by), differing)
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, stacklevel=3)


MASK_COLORS = {"ppo_masked": "tab:red", "dppo_masked": "tab:blue"}
"""Colours of the clipped-token figure: what ratio clipping blocks, what DPPO blocks (all tokens in grey)."""


def draw_bucket_bars(ax: Axes, tokens: pd.DataFrame) -> None:
    """Bars: % of the tokens (A ≠ 0) in each μ bucket that each mask blocked (weighted by the sample's weights:
    an estimate over all tokens)."""
    weight = tokens["weight"]
    blocked = pd.DataFrame({mask: tokens[mask].astype(float) * weight for mask in MASKS}).assign(_weight=weight)
    sums = blocked.groupby(tokens["mu_bucket"], observed=False).sum()
    shares = sums[list(MASKS)].div(sums["_weight"].replace(0, np.nan), axis=0) * 100
    x = np.arange(len(shares))
    width = 0.8 / len(MASKS)
    for i, (mask, name) in enumerate(MASKS.items()):
        ax.bar(x + (i - (len(MASKS) - 1) / 2) * width, shares[mask].fillna(0), width, color=MASK_COLORS[mask],
               label=name)
    ax.set_xticks(x, [str(bucket) for bucket in shares.index], fontsize=8)
    ax.set_title("Blocked tokens by μ bucket", fontsize=10)
    ax.set_ylabel("% of tokens (A ≠ 0)", fontsize=8)


def draw_histograms(ax: Axes, tokens: pd.DataFrame, field: str, bins: np.ndarray, title: str) -> None:
    """Step histograms (densities, weighted by the sample's weights) of ``field`` over all tokens and over the tokens
    each mask blocked."""
    known = tokens[tokens[field].notna()]
    ax.hist(known[field], bins=bins, weights=known["weight"], density=True, color="0.6", alpha=0.5,
            label="all tokens")
    for mask, name in MASKS.items():
        blocked = known[known[mask]]
        if len(blocked):
            ax.hist(blocked[field], bins=bins, weights=blocked["weight"], density=True, histtype="step",
                    linewidth=1.6, color=MASK_COLORS[mask], label=name)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("density", fontsize=8)


def plot_blocked_tokens(tokens: pd.DataFrame, bins: int = 20) -> Figure:
    """The clipped-token analysis of ``tokens.jsonl`` samples (:func:`~dppo_oat.analysis.tokens.load_tokens`):
    the share blocked per μ bucket by ratio clipping and by DPPO, and the μ and entropy of the blocked tokens
    against all tokens (sec:training_efficiency: clipped tokens are mostly low-probability, high-entropy)."""
    active = tokens[tokens["sample"] != "zero"]
    if active.empty:
        raise ValueError("no token samples with a non-zero advantage to analyse")
    fig, axes = new_axes(3, 3)
    draw_bucket_bars(axes[0], active)
    draw_histograms(axes[1], active, "mu", np.linspace(0, 1, bins + 1), "μ of blocked tokens")
    draw_histograms(axes[2], active, "entropy", np.linspace(0, active["entropy"].max() or 1, bins + 1),
                    "Entropy of blocked tokens")
    axes[1].set_xlabel("μ(a_t)", fontsize=8)
    axes[2].set_xlabel("entropy (nats)", fontsize=8)
    for ax in axes:
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, linewidth=0.5, axis="y")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles=handles, labels=labels, loc="outside upper center", ncols=len(handles), frameon=False,
               fontsize=9)
    return fig
