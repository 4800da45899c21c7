"""Degenerate arms (``dppo_oat.analysis.degenerate``): an arm whose rule blocked almost nothing, blocked most tokens,
or whose runs collapsed within their first steps is flagged, by thresholds that are data; ``compare_methods`` and
``dppo-plot`` name the flag (``test_plot`` checks the legend)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_analysis import write_run

from dppo_oat.analysis import DEGENERATE, arm_flags, compare_methods, comparison_notes, curve_flags, load_runs
from dppo_oat.analysis.degenerate import collapse_step, designed_without_trust_region, flag_text, has_collapsed

STEADY = [0.3 + 0.01 * step for step in range(20)]
DEAD_AT_ONCE = [0.4, 0.1] + [0.0] * 18


def rows(success: list[float], masked: float, jitter: float = 0.0) -> list[dict]:
    """Metric rows with a training success curve (moved by ``jitter``: runs of other seeds or arms are not copies
    of each other, which the analysis would skip) and a constant blocked share."""
    return [{"step": step, "reward": value + jitter, "success": value + jitter, "mask/fraction": masked}
            for step, value in enumerate(success, start=1)]


def write_arms(root, seeds=(0, 1)):
    """SAPO blocking nothing, PG-IS blocking nothing by design, GSPO blocking 60% and dead from its second step,
    DPPO-Binary-TV blocking 2% and learning."""
    for seed in seeds:
        jitter = 1e-4 * seed
        write_run(root, f"sapo-s{seed}", algo="sapo", seed=seed, metrics=rows(STEADY, 0.0, jitter),
                  trust_region={"rule": "sapo"})
        write_run(root, f"pg_is-s{seed}", algo="pg_is", seed=seed, metrics=rows(STEADY, 0.0, jitter + 5e-5),
                  trust_region={"rule": "none"})
        write_run(root, f"gspo-s{seed}", algo="gspo", seed=seed, metrics=rows(DEAD_AT_ONCE, 0.6, jitter),
                  trust_region={"rule": "gspo", "eps_low": 3e-4, "eps_high": 4e-4})
        write_run(root, f"dppo-s{seed}", seed=seed, metrics=rows(STEADY, 0.02, jitter))
    return root


def test_the_thresholds_are_data_and_bound_the_flags():
    """Under 0.1% blocked: no trust region in effect; over 50%: blocks most tokens; more than half of the runs
    collapsed within 5 steps; a rule without a trust region by design is not flagged for blocking nothing."""
    assert (DEGENERATE.no_trust_region_below, DEGENERATE.blocks_most_above, DEGENERATE.collapse_within) == (
        0.001, 0.5, 5)
    assert flag_text(0.0009, 0.0, 0, 8, False) == "no trust region in effect (blocked 0.09%)"
    assert flag_text(0.0, 0.0, 0, 8, False) == "no trust region in effect (blocked 0.00%)"
    assert flag_text(0.00001, 0.0, 0, 8, False) == "no trust region in effect (blocked 0.001%)"
    assert flag_text(0.001, 0.0, 0, 8, False) == flag_text(0.5, 0.5, 0, 8, False) == ""
    assert flag_text(0.51, 0.6, 0, 8, False) == "blocks most tokens (blocked 51.00%)"
    assert flag_text(0.0, 0.0, 0, 8, True) == ""  # PG-IS: no trust region is its design
    assert flag_text(0.42, 0.6, 5, 8, False) == "collapsed within 5 steps in 5 of 8 runs (blocked 60.00% in steps 1–5)"
    assert flag_text(0.42, 0.6, 4, 8, False) == ""  # half is not most
    assert flag_text(math.nan, math.nan, 0, 8, False) == ""  # no blocked share logged: nothing to read
    stricter = replace(DEGENERATE, no_trust_region_below=0.01, collapse_within=3)
    assert flag_text(0.005, 0.0, 0, 8, False, stricter) == "no trust region in effect (blocked 0.50%)"
    assert flag_text(0.02, math.nan, 8, 8, False, stricter) == "collapsed within 3 steps in 8 of 8 runs"


def test_the_collapse_step_is_where_a_collapsed_run_stays_under_the_collapse_line():
    steps = np.arange(1, 51)
    late = np.r_[np.linspace(0.3, 0.6, 30), np.zeros(20)]
    assert has_collapsed(late) and 30 <= collapse_step(steps, late) <= 33  # smoothed: a step or two after
    dead = np.r_[0.4, 0.1, np.zeros(48)]
    assert collapse_step(steps, dead) <= 3
    assert math.isnan(collapse_step(steps, np.full(50, 0.4)))  # steady: no collapse
    low = np.r_[0.08, 0.02, np.zeros(48)]  # halved, but less than 0.1 under its peak: noise at a few %
    assert not has_collapsed(low) and math.isnan(collapse_step(steps, low))
    bumpy = np.r_[0.4, 0.0, 0.0, 0.4, np.zeros(46)]  # back above the line at step 4: it stays under from later on
    assert collapse_step(steps, bumpy) > 4


def test_a_rule_has_no_trust_region_by_design_only_when_it_says_so():
    assert designed_without_trust_region("pg_is") and designed_without_trust_region("cispo")
    assert not designed_without_trust_region("sapo") and not designed_without_trust_region("dppo_binary_tv")
    assert designed_without_trust_region("dppo_binary_tv", {"rule": "none"})  # the config's rule wins
    assert not designed_without_trust_region("my_own_rule")


def test_arms_are_flagged_from_their_runs(tmp_path):
    df = load_runs(str(write_arms(tmp_path) / "*"))
    assert curve_flags(df, "method") == {
        "SAPO": "no trust region in effect (blocked 0.00%)",
        "GSPO": "blocks most tokens (blocked 60.00%); collapsed within 5 steps in 2 of 2 runs (blocked 60.00% in "
                "steps 1–5)"}
    assert curve_flags(df, "seed") == {}  # a seed's curve pools methods: not an arm
    assert set(curve_flags(df, "label")) == {"SAPO · seed 0", "SAPO · seed 1", "GSPO · seed 0", "GSPO · seed 1"}
    runs = pd.DataFrame({"arm": ["a", "a", "a", "b"], "blocked": [0.02, 0.02, 0.02, 0.0],
                         "blocked_early": [0.1] * 4, "collapse_step": [2.0, 4.0, math.nan, math.nan],
                         "by_design": [False, False, False, True]})
    table = arm_flags(runs, "arm")
    assert list(table["early_collapses"]) == [2, 0] and list(table["runs"]) == [3, 1]
    assert table.loc["a", "flag"].startswith("collapsed within 5 steps in 2 of 3 runs") and table.loc["b", "flag"] == ""
    assert arm_flags(runs, "arm", replace(DEGENERATE, collapse_within=3)).loc["a", "flag"] == ""


def test_compare_methods_names_each_flag(tmp_path):
    table = compare_methods(load_runs(str(write_arms(tmp_path) / "*")))
    assert table.loc["SAPO", "flag"] == "no trust region in effect (blocked 0.00%)"
    assert table.loc["PG-IS", "flag"] == table.loc["DPPO-Binary-TV", "flag"] == ""
    assert comparison_notes(table)[-1] == (
        "flagged curves (their rule cannot be read as a trust region): GSPO: blocks most tokens (blocked 60.00%); "
        "collapsed within 5 steps in 2 of 2 runs (blocked 60.00% in steps 1–5); SAPO: no trust region in effect "
        "(blocked 0.00%)")


def test_runs_without_a_blocked_share_or_a_success_curve_are_not_flagged(tmp_path):
    write_run(tmp_path, "a", metrics=[{"step": s, "reward": 0.1 * s} for s in range(1, 11)])
    df = load_runs([tmp_path / "a"])
    assert curve_flags(df, "method") == {}
    assert compare_methods(df)["flag"].tolist() == [""]


@pytest.mark.parametrize("share, shown", [(0.0, "0.00%"), (0.4222, "42.22%"), (0.0000084, "0.0008%")])
def test_blocked_shares_are_written_as_the_flag_shows_them(share, shown):
    from dppo_oat.analysis.degenerate import percent

    assert percent(share) == shown
