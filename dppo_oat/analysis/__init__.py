"""Learning curves like the paper's, from any run directory the trainers write::

    from dppo_oat.analysis import load_runs, plot_runs

    df = load_runs("runs/*")        # long table: run, label, method, algo, env, seed, path, step, metric, value
    fig = plot_runs(df, ["reward", "mismatch", "mask_fraction"])   # σ = 2 smoothing, raw curves shaded behind
    fig.savefig("curves.png")

``python -m dppo_oat.plot`` (``dppo-plot``) is the same from the command line; ``notebooks/`` walks through the
paper's stability, efficiency and clipped-token analyses on your own runs.
"""

from dppo_oat.analysis.curves import BANDS, aggregate_seeds, compare_methods, comparison_notes, smooth
from dppo_oat.analysis.degenerate import DEGENERATE, DegenerateRule, arm_flags, curve_flags, run_degeneracy
from dppo_oat.analysis.figures import plot_blocked_tokens, plot_runs
from dppo_oat.analysis.panels import DEFAULT_PANELS, PANELS, Panel, Series, available_panels
from dppo_oat.analysis.run_checks import DamagedRun
from dppo_oat.analysis.runs import (
    PRESET_NAMES,
    RUN_COLUMNS,
    Run,
    is_run_dir,
    label_runs,
    load_run,
    load_runs,
    notebook_runs,
    resolve_run_dirs,
    run_patterns,
    summarize_runs,
)
from dppo_oat.analysis.stats import decide, holm, margin_tests, paired_difference, sample_std, time_to_threshold
from dppo_oat.analysis.tokens import (
    TOKEN_PANELS,
    disagreements,
    exported_masked_by_bucket,
    load_token_exports,
    load_tokens,
    masked_by_bucket,
    shadow_notes,
    shadow_summary,
    token_step_metrics,
    top_clipped_side_by_side,
    top_clipped_tokens,
    top_disagreement_tokens,
)

__all__ = [
    "BANDS", "DEFAULT_PANELS", "DEGENERATE", "DegenerateRule", "PANELS", "PRESET_NAMES", "RUN_COLUMNS", "TOKEN_PANELS",
    "DamagedRun", "Panel", "Run",
    "Series",
    "aggregate_seeds", "arm_flags", "available_panels", "curve_flags", "run_degeneracy", "compare_methods",
    "comparison_notes", "disagreements", "is_run_dir", "label_runs", "load_run", "load_runs",
    "load_tokens", "load_token_exports", "exported_masked_by_bucket", "masked_by_bucket", "notebook_runs",
    "plot_blocked_tokens", "plot_runs", "resolve_run_dirs",
    "run_patterns", "shadow_notes", "shadow_summary", "smooth", "summarize_runs", "token_step_metrics",
    "top_clipped_side_by_side",
    "top_clipped_tokens", "top_disagreement_tokens", "paired_difference", "sample_std", "time_to_threshold",
    "decide", "holm", "margin_tests",
]
