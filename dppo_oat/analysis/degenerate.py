"""Arms whose trust region cannot be read as one, named before any comparison is read off them.

An *arm* is one method under one setting across its seeds: a curve of
:func:`~dppo_oat.analysis.figures.plot_runs`, a row of a study. A comparison of two arms says something about a
trust region only when the rule acted as one. :func:`arm_flags` flags an arm when, over its runs:

- its mean blocked share (``mask/fraction``: the share of the A ≠ 0 tokens its rule blocked, averaged over steps
  1..N and over its runs) is under :attr:`DegenerateRule.no_trust_region_below`: *no trust region in effect*;
- that share is over :attr:`DegenerateRule.blocks_most_above`: it *blocks most tokens*;
- more than half of its runs collapsed within :attr:`DegenerateRule.collapse_within` steps (:func:`collapse_step`).

A rule with no trust region by design (``rule`` ``none``: PG-IS, CISPO) is not flagged for blocking nothing: that
is what it is. A soft rule that never blocks a token (SAPO's gate, MinPRO's prefix weight, DRPO's penalty) is: the
blocked share cannot see its weights, and the flag says what was measured. The thresholds are data
(:data:`DEGENERATE`); a study passes its own collapse rule (``dataclasses.replace``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dppo_oat.analysis.run_checks import DamagedRun, read_config
from dppo_oat.analysis.smoothing import smooth
from dppo_oat.trust_region import PRESETS, TrustRegion

BLOCKED_METRIC = "mask/fraction"
"""The share of the A ≠ 0 tokens a run's own rule blocked at a step."""
COLLAPSE_METRIC = "success"
"""The curve a collapse is read on: training success (a share, so that the collapse rule's absolute drop means the
same for every task)."""


@dataclass(frozen=True)
class DegenerateRule:
    """When an arm is flagged (:func:`arm_flags`). The collapse rule: a run *collapses* when its final value (mean
    of the last ``tail`` share of its steps) is below ``collapse_ratio`` × its smoothed peak (σ ``sigma`` steps)
    and at least ``collapse_min_drop`` under it."""

    no_trust_region_below: float = 0.001
    """Mean blocked share under which the arm had no trust region in effect (0.1% of the tokens)."""
    blocks_most_above: float = 0.5
    """Mean blocked share over which the arm blocked most tokens."""
    collapse_within: int = 5
    """An arm more than half of whose runs collapsed by this step is flagged (:func:`collapse_step`)."""
    collapse_ratio: float = 0.5
    collapse_min_drop: float = 0.1
    sigma: float = 2.0
    tail: float = 0.1


DEGENERATE = DegenerateRule()
"""The thresholds :func:`arm_flags`, ``plot_runs`` and ``compare_methods`` use unless given others."""


def tail_mean(values: np.ndarray, share: float) -> float:
    """The mean of the last ``share`` of ``values`` (at least one)."""
    return float(np.mean(values[-max(1, round(share * len(values))):]))


def has_collapsed(values: np.ndarray, rule: DegenerateRule = DEGENERATE) -> bool:
    """The collapse rule on one run's curve (``values`` in step order): its final value below
    ``rule.collapse_ratio`` × its smoothed peak and at least ``rule.collapse_min_drop`` under it."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return False
    peak, final = float(smooth(values, rule.sigma).max()), tail_mean(values, rule.tail)
    return final < rule.collapse_ratio * peak and peak - final >= rule.collapse_min_drop


def collapse_step(steps: np.ndarray, values: np.ndarray, rule: DegenerateRule = DEGENERATE) -> float:
    """The step from which a collapsed run's curve stays under the collapse line to its end (the line:
    ``rule.collapse_ratio`` × its smoothed peak, and ``rule.collapse_min_drop`` under it; the curve as logged, so
    that smoothing does not delay it); its last step when its last value is not under the line; NaN when the run
    did not collapse (:func:`has_collapsed`)."""
    values = np.asarray(values, dtype=float)
    if not has_collapsed(values, rule):
        return math.nan
    peak = float(smooth(values, rule.sigma).max())
    under = values < min(rule.collapse_ratio * peak, peak - rule.collapse_min_drop)
    stays = np.flip(np.logical_and.accumulate(np.flip(under)))  # under from here to the end
    return float(np.asarray(steps)[int(np.argmax(stays))] if stays.any() else np.asarray(steps)[-1])


def designed_without_trust_region(algo: str, trust_region: dict | None = None) -> bool:
    """Whether a run's rule has no trust region by design (``rule`` ``none``): its config's rule when it records
    one, else its preset's; False for a custom rule the package does not know."""
    rule = (trust_region or {}).get("rule")
    if rule is None and algo in PRESETS:
        rule = TrustRegion.preset(algo).rule
    return rule == "none"


FLAGGED_GROUPINGS = ("method", "variant", "algo", "label", "run")
"""The groupings of ``plot_runs`` whose curves are arms (one method, its seeds or one run): ``env`` and ``seed`` pool
methods, so their curves are not flagged."""


def curve_flags(df: pd.DataFrame, by, rule: DegenerateRule = DEGENERATE) -> dict:
    """The flag of each flagged curve of ``df`` grouped ``by`` (:func:`arm_flags`), by group key; none when ``by``
    is not an arm (:data:`FLAGGED_GROUPINGS`) or the runs log neither a blocked share nor training success."""
    if by not in FLAGGED_GROUPINGS or by not in df.columns or "algo" not in df.columns:
        return {}
    if not df["metric"].isin([BLOCKED_METRIC, COLLAPSE_METRIC]).any():
        return {}
    flags = arm_flags(run_degeneracy(df, rule).reset_index(), by, rule)["flag"]
    return {group: flag for group, flag in flags.items() if flag}


def run_degeneracy(df: pd.DataFrame, rule: DegenerateRule = DEGENERATE) -> pd.DataFrame:
    """One row per run of the long table (:func:`~dppo_oat.analysis.runs.load_runs`), indexed by run: its run
    columns; ``blocked`` (mean ``mask/fraction`` over its steps) and ``blocked_early`` (over steps
    ≤ ``rule.collapse_within``), NaN where it logs none; ``collapse_step`` (:func:`collapse_step` on its training
    success; NaN where it did not collapse or logs no success); ``by_design`` (:func:`designed_without_trust_region`,
    from its config)."""
    runs = df.drop_duplicates("run").set_index("run")
    keep = [c for c in runs.columns if c not in ("step", "metric", "value")]
    runs = runs[keep].copy()
    blocked = df[df["metric"] == BLOCKED_METRIC]
    runs["blocked"] = blocked.groupby("run")["value"].mean()
    runs["blocked_early"] = blocked[blocked["step"] <= rule.collapse_within].groupby("run")["value"].mean()
    success = df[df["metric"] == COLLAPSE_METRIC].sort_values(["run", "step"], kind="stable")
    steps = {run: collapse_step(rows["step"].to_numpy(), rows["value"].to_numpy(), rule)
             for run, rows in success.groupby("run")}
    runs["collapse_step"] = pd.Series(steps, dtype=float)
    runs["by_design"] = [designed_without_trust_region(row.algo, _trust_region(row)) for row in runs.itertuples()]
    return runs


def _trust_region(row) -> dict:
    """The trust region a run's config records ({} when its config cannot be read or has none)."""
    if not hasattr(row, "path"):
        return {}
    try:
        trust_region = read_config(Path(row.path)).get("trust_region")
    except DamagedRun:
        return {}
    return trust_region if isinstance(trust_region, dict) else {}


def arm_flags(runs: pd.DataFrame, by, rule: DegenerateRule = DEGENERATE) -> pd.DataFrame:
    """One row per arm (the groups of ``runs`` by the column or columns ``by``; ``runs`` has one row per run with
    ``blocked``, ``blocked_early``, ``collapse_step`` and ``by_design``, as :func:`run_degeneracy` gives them):
    ``runs``, ``blocked`` and ``blocked_early`` (means over its runs), ``early_collapses`` (runs whose collapse step
    is ≤ ``rule.collapse_within``) and ``flag``, the sentence :func:`flag_text` writes (empty when none)."""
    grouped = runs.groupby(by, sort=False)
    table = pd.DataFrame({
        "runs": grouped.size(),
        "blocked": grouped["blocked"].mean(),
        "blocked_early": grouped["blocked_early"].mean(),
        "early_collapses": grouped["collapse_step"].apply(lambda s: int((s <= rule.collapse_within).sum())),
        "by_design": grouped["by_design"].all(),
    })
    table["flag"] = [flag_text(row.blocked, row.blocked_early, row.early_collapses, row.runs, row.by_design, rule)
                     for row in table.itertuples()]
    return table


def percent(share: float) -> str:
    """A blocked share as a flag writes it: ``0.00%`` for none, two decimals from 0.01% up (``42.22%``), one
    significant digit below (``0.001%``)."""
    value = 100 * share
    return f"{value:.2f}%" if value == 0 or value >= 0.01 else f"{value:.1g}%"


def flag_text(blocked: float, blocked_early: float, early_collapses: int, runs: int, by_design: bool,
              rule: DegenerateRule = DEGENERATE) -> str:
    """Why an arm cannot be read as a trust region, as one clause per reason joined by ``; `` (empty: it can).
    ``blocked`` NaN (no ``mask/fraction`` logged) flags nothing on the blocked share."""
    reasons = []
    if not math.isnan(blocked) and blocked < rule.no_trust_region_below and not by_design:
        reasons.append(f"no trust region in effect (blocked {percent(blocked)})")
    if not math.isnan(blocked) and blocked > rule.blocks_most_above:
        reasons.append(f"blocks most tokens (blocked {percent(blocked)})")
    if early_collapses > runs / 2:
        early = "" if math.isnan(blocked_early) or by_design else (
            f" (blocked {percent(blocked_early)} in steps 1–{rule.collapse_within})")
        reasons.append(f"collapsed within {rule.collapse_within} steps in {early_collapses} of {runs} runs{early}")
    return "; ".join(reasons)
