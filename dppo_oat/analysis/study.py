"""Tables of a study: many methods × conditions × seeds, as ``scripts/cpu_study.py`` writes them.

A study directory holds one folder per task, each with one run directory per (method, condition, seed)::

    <study>/study.json                      the plan and each run's state
    <study>/<task>/<method>-<condition>-s<seed>/{config.json, metrics.jsonl, eval.jsonl}   (or *.jsonl.gz, packed)

:func:`load_study` reads it into the long table of :func:`~dppo_oat.analysis.runs.load_runs` with three more run
columns, ``task`` (its folder), ``condition`` (from the run's name) and ``mismatch`` (the rollout's precision or
log-prob noise, from its config). :func:`run_outcomes` reduces each run to the numbers the study's claims are scored
on, :func:`contrast_table` scores the pre-registered :data:`CONTRASTS` by paired seeds (bootstrap CI, permutation
p-value, verdict against the margin), and :func:`summary_lines` writes the summary in docs/cpu-study.md from that table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from dppo_oat.analysis.curves import smooth
from dppo_oat.analysis.run_checks import read_config
from dppo_oat.analysis.runs import PathLike, label_runs, load_runs
from dppo_oat.analysis.stats import paired_difference, sample_std, time_to_threshold, verdict

GROUP = ["task", "variant", "condition"]
"""One row of a study table: a method (the preset's paper name) under one condition on one task."""
COLLAPSE_RATIO = 0.5
COLLAPSE_MIN_DROP = 0.1
"""A run *collapses* when its final training success is below ``COLLAPSE_RATIO`` of its smoothed peak and at least
``COLLAPSE_MIN_DROP`` (absolute) under it: at a success of a few %, halving is within the noise of one rollout."""
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8", "int6": "int6",
                   "int4": "int4"}


def load_study(study_dir: PathLike) -> pd.DataFrame:
    """Every run of the study as one long table (``run``: ``<task>/<run name>``), with ``task``, ``condition``,
    ``mismatch`` and ``arm_method`` (the study's name of the method: a preset, or ``preset@name=value`` with
    overrides) run columns; ``method`` is the variant."""
    run_dirs = sorted(Path(study_dir).glob("*/*/config.json"))
    if not run_dirs:
        raise FileNotFoundError(f"no study runs under {study_dir!r}: run scripts/cpu_study.py first")
    df = load_runs([str(path.parent) for path in run_dirs])  # damaged runs are skipped with a warning
    configs = {path: read_config(Path(path)) for path in df["path"].unique()}
    df["run"] = df["path"].map(lambda p: f"{Path(p).parent.name}/{Path(p).name}")  # tasks share run names
    df["task"] = df["path"].map(lambda p: Path(p).parent.name)
    df["condition"] = df["path"].map(lambda p: condition_of(Path(p).name))
    df["arm_method"] = df["path"].map(lambda p: Path(p).name.split("-", 1)[0])
    df["mismatch"] = df["path"].map(lambda p: mismatch_of(configs[p]))
    return label_runs(df)


def condition_of(run_name: str) -> str:
    """``<method>-<condition>-s<seed>`` → ``<condition>`` (preset names have no ``-``)."""
    parts = run_name.split("-", 1)
    return parts[1].rsplit("-s", 1)[0] if len(parts) == 2 and "-s" in parts[1] else "default"


def mismatch_of(config: dict) -> str:
    """The injected training-inference mismatch of a run's config: the rollout precision (``fp32``, ``bf16``,
    ``fp16``, ``int8``), with ``+noise`` when log-probs were perturbed."""
    precision = PRECISION_NAMES.get(config.get("rollout_dtype", "float32"), config.get("rollout_dtype"))
    return f"{precision}+noise" if config.get("logprob_noise", 0.0) else precision


def study_progress(study_dir: PathLike) -> pd.DataFrame:
    """Runs per task and state (``done``/``partial``/``new``) from ``study.json``."""
    manifest = json.loads((Path(study_dir) / "study.json").read_text())
    runs = pd.DataFrame(manifest["runs"])
    return runs.groupby(["task", "state"]).size().unstack(fill_value=0)


def per_run_curve(df: pd.DataFrame, metric: str, sigma: float = 2.0) -> pd.DataFrame:
    """``metric`` per run and step, smoothed along each run (σ in logged steps): columns run, step, value, smooth."""
    rows = df[df["metric"] == metric].sort_values(["run", "step"], kind="stable")[["run", "step", "value"]]
    rows = rows.assign(smooth=rows.groupby("run")["value"].transform(lambda v: smooth(v.to_numpy(), sigma)))
    return rows.reset_index(drop=True)


def run_outcomes(df: pd.DataFrame, threshold: float, metric: str = "success", sigma: float = 2.0,
                 tail: float = 0.1) -> pd.DataFrame:
    """One row per run: its study columns; ``auc`` (mean ``metric`` over all steps: the area under its curve per
    step); first step where smoothed ``metric`` ≥ ``threshold`` (NaN if never) and ``last_step`` (where a run that
    never reached it is censored); initial/peak/final (mean of the last ``tail`` share) ``metric`` and whether it
    collapsed; held-out success before and after; |π − μ| (all minibatches, and the first minibatch alone: the
    engine's share) at the start and the end; the mean bad-update, masked and IS-truncated fractions."""
    curve = per_run_curve(df, metric, sigma)
    runs = df.drop_duplicates("run").set_index("run")[["task", "variant", "algo", "arm_method", "condition",
                                                          "mismatch", "seed"]]
    grouped = curve.groupby("run")
    runs["auc"] = grouped["value"].mean()
    runs["steps_to_threshold"] = grouped.apply(lambda r: _first_step_at(r, threshold))
    runs["last_step"] = grouped["step"].max()
    runs["initial"] = grouped["value"].apply(lambda v: _head(v, tail))
    runs["peak"] = grouped["smooth"].max()
    runs["final"] = grouped["value"].apply(lambda v: _tail(v, tail))
    runs["collapsed"] = (runs["final"] < COLLAPSE_RATIO * runs["peak"]) & (runs["peak"] - runs["final"] >= COLLAPSE_MIN_DROP)
    for name, column in (("mismatch", "mismatch/abs_diff_mean"), ("engine_mismatch", "mismatch/first_abs_diff_mean")):
        values = per_run_curve(df, column, 0).groupby("run")["value"]
        runs[f"{name}_start"] = values.apply(lambda v: _head(v, tail))
        runs[f"{name}_end"] = values.apply(lambda v: _tail(v, tail))
        runs[f"{name}_growth"] = runs[f"{name}_end"] / runs[f"{name}_start"].replace(0, np.nan)
    evals = df[df["metric"] == "eval/success"].sort_values("step").groupby("run")["value"]
    runs["eval_before"], runs["eval_after"] = evals.first(), evals.last()
    for name, column in (("bad_update", "bad_update/fraction"), ("masked", "mask/fraction"),
                         ("is_truncated", "is/truncated_fraction")):
        runs[name] = df[df["metric"] == column].groupby("run")["value"].mean()
    return runs.reset_index()


def _first_step_at(rows: pd.DataFrame, threshold: float) -> float:
    reached = rows[rows["smooth"] >= threshold]
    return float(reached["step"].iloc[0]) if len(reached) else float("nan")


def _head(values: pd.Series, share: float) -> float:
    return float(values.head(max(1, round(share * len(values)))).mean())


def _tail(values: pd.Series, share: float) -> float:
    return float(values.tail(max(1, round(share * len(values)))).mean())


def study_table(outcomes: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, method, condition): seeds; training success as AUC and final, each mean ± sample std
    (ddof = 1); the Kaplan-Meier median and restricted mean steps to threshold (runs that never reach it censored,
    not dropped) and how many reached it; collapses; held-out success before → after; |π − μ| start → end, overall
    and first-minibatch; the mean bad-update / masked / IS-truncated shares in %."""
    groups = outcomes.groupby(GROUP, sort=False)
    survival = groups.apply(lambda g: time_to_threshold(g["steps_to_threshold"].to_numpy(), g["last_step"].to_numpy()))
    table = pd.DataFrame({
        "seeds": groups.size(),
        "AUC": groups["auc"].mean(),
        "AUC ± std": groups["auc"].apply(sample_std),
        "final success": groups["final"].mean(),
        "final ± std": groups["final"].apply(sample_std),
        "reached": survival.map(lambda t: t.reached),
        "KM median steps": survival.map(lambda t: t.median),
        "mean steps (restricted)": survival.map(lambda t: t.restricted_mean),
        "collapses": groups["collapsed"].sum().astype(int),
        "eval before": groups["eval_before"].mean(),
        "eval after": groups["eval_after"].mean(),
        "|π−μ| start": groups["mismatch_start"].mean(),
        "|π−μ| end": groups["mismatch_end"].mean(),
        "engine |π−μ| start": groups["engine_mismatch_start"].mean(),
        "engine |π−μ| end": groups["engine_mismatch_end"].mean(),
        "bad updates %": 100 * groups["bad_update"].mean(),
        "masked %": 100 * groups["masked"].mean(),
        "IS truncated %": 100 * groups["is_truncated"].mean(),
    })
    return table


def probe_table(df: pd.DataFrame) -> pd.DataFrame:
    """Binary vs top-K vs exact divergence on the study's real batches (the ``probe/*`` metrics), per task and
    condition: mean D_TV and D_KL of each estimate, what share of the exact one each bound recovers, and the share of
    tokens each estimate puts above δ (means over the probes of every run)."""
    rows = df[df["metric"].str.startswith("probe/")]
    if rows.empty:
        return pd.DataFrame()
    means = rows.groupby(["task", "condition", "metric"])["value"].mean().unstack("metric")
    columns = {}
    for divergence in ("tv", "kl"):
        for estimate in ("binary", "topk", "exact"):
            columns[f"probe/{estimate}_{divergence}_mean"] = f"{estimate} {divergence.upper()}"
        for estimate in ("binary", "topk"):  # a ratio of means: per-probe ratios blow up where π ≈ μ
            bound, exact = f"probe/{estimate}_{divergence}_mean", f"probe/exact_{divergence}_mean"
            if bound in means and exact in means:
                ratio = f"{estimate}/exact {divergence.upper()}"
                means[ratio] = means[bound] / means[exact]
                columns[ratio] = ratio
    for estimate in ("binary", "topk", "exact"):
        columns[f"probe/{estimate}_tv_above_delta"] = f"{estimate} TV > δ (%)"
    table = means[[c for c in columns if c in means.columns]].rename(columns=columns)
    percent = [c for c in table.columns if c.endswith("(%)")]
    table[percent] = 100 * table[percent]
    return table


# ---------------------------------------------------------------------------------------------------- study v2
# Written down before the runs of scripts/cpu_study.py's ``mismatch`` and ``staleness`` experiments, and not changed
# after: each claim, the per-run number it is scored on, the arms compared seed by seed, and the margin.

COLLAPSE_RULE = (f"final training success (mean of the last 10% of steps) below {COLLAPSE_RATIO} × its smoothed "
                 f"peak and at least {COLLAPSE_MIN_DROP} under it")
THRESHOLD = 0.35
"""Time to threshold: first step at which the smoothed training success reaches 0.35 (the shipped policy starts
near 0.25); a run that never does is censored at its last step."""
AUC_MARGIN = 0.02
"""Two arms' mean training success over the run (the area under the curve per step) must differ by more than this,
with the whole 95% CI of the paired difference beyond it, for a verdict either way."""


@dataclass(frozen=True)
class Contrast:
    """The claim ``left − right > margin`` on ``metric``, paired by seed; arms are ``(method, condition)`` of
    ``task``."""

    claim: str
    source: str
    left: tuple[str, str]
    right: tuple[str, str]
    metric: str = "auc"
    margin: float = AUC_MARGIN
    task: str = "sudoku"


CONTRASTS = (
    Contrast("engine mismatch alone (bf16 rollout) hurts PG-IS", "Takeaway 1",
             ("pg_is", "mb1-fp32"), ("pg_is", "mb1-bf16")),
    Contrast("under engine mismatch (bf16), DPPO-Binary-TV beats PG-IS", "Takeaway 1",
             ("dppo_binary_tv", "mb1-bf16"), ("pg_is", "mb1-bf16")),
    Contrast("under engine mismatch (int8 weights), DPPO-Binary-TV beats PG-IS", "Takeaway 1",
             ("dppo_binary_tv", "mb1-int8"), ("pg_is", "mb1-int8")),
    Contrast("under engine mismatch (bf16), anchoring on μ (DPPO) beats the recomputed anchor (MiniRL)", "Takeaway 2",
             ("dppo_binary_tv", "mb1-bf16"), ("minirl", "mb1-bf16")),
    Contrast("without a trust region the engine mismatch grows (bf16: first-minibatch |π−μ|, end/start)",
             "Takeaway 1", ("pg_is", "mb1-bf16"), ("dppo_binary_tv", "mb1-bf16"), "engine_mismatch_growth", 0.1),
    Contrast("with staleness (4 steps per rollout, lr 5e-4), DPPO-Binary-TV beats PG-IS", "fig:sanity_test",
             ("dppo_binary_tv", "mb4-fp32"), ("pg_is", "mb4-fp32")),
    Contrast("with staleness at lr 1e-4, DPPO-Binary-TV beats PG-IS", "fig:sanity_test",
             ("dppo_binary_tv", "mb4-fp32-lr1e-4"), ("pg_is", "mb4-fp32-lr1e-4")),
    Contrast("with staleness, anchoring on μ (DPPO) beats the recomputed anchor (MiniRL)", "Takeaway 2",
             ("dppo_binary_tv", "mb4-fp32"), ("minirl", "mb4-fp32")),
    Contrast("DPPO-Binary-TV learns faster than GRPO-ClipHigher (staleness)", "sec:training_efficiency",
             ("dppo_binary_tv", "mb4-fp32"), ("grpo_clip_higher", "mb4-fp32")),
    Contrast("DPPO-Binary-TV learns faster than GRPO-ClipHigher (engine mismatch)", "sec:training_efficiency",
             ("dppo_binary_tv", "mb1-bf16"), ("grpo_clip_higher", "mb1-bf16")),
    Contrast("DPPO-TopK-TV is worse than DPPO-Binary-TV (the first study's collapse)", "sec:method_topk",
             ("dppo_binary_tv", "mb4-fp32"), ("dppo_topk_tv", "mb4-fp32")),
    # Added before the runs of the ``recompute``, ``takeaway3`` and ``efficiency`` experiments.
    Contrast("under engine mismatch (bf16), the DPPO-KL mask anchored on μ beats the same mask on the recomputed π_θ'",
             "Takeaway 2", ("dppo_binary_kl", "mb1-bf16"), ("dppo_binary_kl_recompute", "mb1-bf16")),
    Contrast("with staleness, the DPPO-KL mask anchored on μ beats the same mask on the recomputed π_θ'",
             "Takeaway 2", ("dppo_binary_kl", "mb4-fp32"), ("dppo_binary_kl_recompute", "mb4-fp32")),
    Contrast("under engine mismatch (bf16), truncated IS (MiniRL-TIS) beats MiniRL", "Takeaway 2",
             ("minirl_tis", "mb1-bf16"), ("minirl", "mb1-bf16")),
    Contrast("masking only negative samples that fell far (mask-negative, δ 0.5) stabilises PG-IS", "Takeaway 3",
             ("mask_negative", "mb4-fp32"), ("pg_is", "mb4-fp32")),
    Contrast("DPPO-Binary-TV beats mask-negative (the paper: comparable)", "fig:ablation_mask_negative",
             ("dppo_binary_tv", "mb4-fp32"), ("mask_negative", "mb4-fp32")),
    Contrast("mask-negative at δ 0.5 beats δ 0.8", "Takeaway 3",
             ("mask_negative", "mb4-fp32"), ("mask_negative@delta=0.8", "mb4-fp32")),
    Contrast("relaxing both clip ends for μ < 0.1 (Relax-both) learns faster than GRPO-ClipHigher",
             "fig:low_prob_sweep", ("relax_both", "mb4-fp32"), ("grpo_clip_higher", "mb4-fp32")),
    Contrast("Relax-low learns faster than Relax-high", "fig:clip_direction",
             ("relax_low", "mb4-fp32"), ("relax_high", "mb4-fp32")),
    # Added before the runs of the ``noise`` experiment.
    Contrast("engine mismatch alone (fp16 rollout) hurts PG-IS", "Takeaway 1",
             ("pg_is", "mb1-fp32"), ("pg_is", "mb1-fp16")),
    Contrast("under engine mismatch (fp16), DPPO-Binary-TV beats PG-IS", "Takeaway 1",
             ("dppo_binary_tv", "mb1-fp16"), ("pg_is", "mb1-fp16")),
    Contrast("noise on log μ (σ 0.5) hurts PG-IS", "Takeaway 1",
             ("pg_is", "mb1-fp32"), ("pg_is", "mb1-noise0.5")),
    Contrast("under noise on log μ (σ 0.1), DPPO-Binary-TV beats PG-IS", "Takeaway 1",
             ("dppo_binary_tv", "mb1-noise0.1"), ("pg_is", "mb1-noise0.1")),
    Contrast("under noise on log μ (σ 0.5), DPPO-Binary-TV beats PG-IS", "Takeaway 1",
             ("dppo_binary_tv", "mb1-noise0.5"), ("pg_is", "mb1-noise0.5")),
    Contrast("noise on log μ (σ 0.5) hurts DPPO-Binary-TV (its mask then fires on noise)", "Takeaway 1",
             ("dppo_binary_tv", "mb1-fp32"), ("dppo_binary_tv", "mb1-noise0.5")),
    # Added before the runs of the ``guess`` experiment (the second task).
    Contrast("Guess: with staleness (4 steps per rollout, lr 5e-4), DPPO-Binary-TV beats PG-IS", "fig:sanity_test",
             ("dppo_binary_tv", "mb4-fp32"), ("pg_is", "mb4-fp32"), task="guess"),
    Contrast("Guess: with staleness, anchoring on μ (DPPO) beats the recomputed anchor (MiniRL)", "Takeaway 2",
             ("dppo_binary_tv", "mb4-fp32"), ("minirl", "mb4-fp32"), task="guess"),
    Contrast("Guess: DPPO-Binary-TV learns faster than GRPO-ClipHigher (staleness)", "sec:training_efficiency",
             ("dppo_binary_tv", "mb4-fp32"), ("grpo_clip_higher", "mb4-fp32"), task="guess"),
    Contrast("Guess: DPPO-TopK-TV is worse than DPPO-Binary-TV", "sec:method_topk",
             ("dppo_binary_tv", "mb4-fp32"), ("dppo_topk_tv", "mb4-fp32"), task="guess"),
)
"""The study's claims, fixed before its runs. ``auc``: mean training success over all steps; the claim holds when
the paired 95% CI of ``left − right`` lies above ``margin``, is refuted below ``−margin``, else is inconclusive."""


def arm_values(outcomes: pd.DataFrame, task: str, arm: tuple[str, str], metric: str) -> pd.Series:
    """``metric`` of the runs of one arm ``(method, condition)`` of ``task``, indexed by seed."""
    method, condition = arm
    rows = outcomes[(outcomes["arm_method"] == method) & (outcomes["condition"] == condition)
                    & (outcomes["task"] == task)]
    return rows.set_index("seed")[metric].dropna()


def score_contrast(outcomes: pd.DataFrame, contrast: Contrast) -> dict:
    """One pre-registered contrast on the study's runs: both arms' means, the paired difference's mean, 95% CI and
    permutation p-value over the seeds both arms have, the verdict (``not run`` under 2 pairs), and
    ``within_margin``: the whole CI inside ±margin, i.e. no difference as large as the margin (an inconclusive
    verdict that still says something)."""
    left = arm_values(outcomes, contrast.task, contrast.left, contrast.metric)
    right = arm_values(outcomes, contrast.task, contrast.right, contrast.metric)
    pairs = left.index.intersection(right.index)
    row = {"claim": contrast.claim, "source": contrast.source, "metric": contrast.metric, "margin": contrast.margin,
           "pairs": len(pairs), "left": float(left.loc[pairs].mean()) if len(pairs) else np.nan,
           "right": float(right.loc[pairs].mean()) if len(pairs) else np.nan}
    if len(pairs) < 2:
        return {**row, "difference": np.nan, "ci_low": np.nan, "ci_high": np.nan, "p": np.nan, "verdict": "not run",
                "within_margin": False}
    difference = paired_difference(left.loc[pairs].to_numpy(), right.loc[pairs].to_numpy())
    return {**row, "difference": difference.mean, "ci_low": difference.low, "ci_high": difference.high,
            "p": difference.p_value, "verdict": verdict(difference, contrast.margin),
            "within_margin": bool(-contrast.margin < difference.low and difference.high < contrast.margin)}


def contrast_table(outcomes: pd.DataFrame, contrasts: tuple[Contrast, ...] = CONTRASTS) -> pd.DataFrame:
    """Every contrast scored (:func:`score_contrast`), in the order they were written down."""
    return pd.DataFrame([score_contrast(outcomes, contrast) for contrast in contrasts])


def summary_lines(table: pd.DataFrame) -> list[str]:
    """The contrast table as Markdown bullets, one per claim: the summary in docs/cpu-study.md and the notebook's last
    cell print these same lines."""
    lines = []
    for row in table.itertuples():
        if row.verdict == "not run":
            lines.append(f"- {row.claim} ({row.source}): not run yet")
            continue
        verdict_text = f"**{row.verdict}**" + (f" (CI within ±{row.margin:g})" if row.within_margin else "")
        lines.append(f"- {row.claim} ({row.source}): {verdict_text} — {row.metric} {row.left:.3g} vs "
                     f"{row.right:.3g}, difference {row.difference:+.3g}, 95% CI [{row.ci_low:+.3g}, "
                     f"{row.ci_high:+.3g}], p = {row.p:.2g}, {row.pairs} paired seeds, margin {row.margin:g}")
    return lines


SUMMARY_MARKER = "<!-- cpu-study:summary -->"
"""The summary of the study in docs/cpu-study.md sits between two of these lines."""


def readme_summary(study_dir: PathLike) -> list[str]:
    """The summary lines of the study in ``study_dir``, scored as the report notebook scores them."""
    return summary_lines(contrast_table(run_outcomes(load_study(study_dir), THRESHOLD)))


def _summary_parts(text: str) -> list[str]:
    parts = text.split(SUMMARY_MARKER + "\n")
    if len(parts) != 3:
        raise ValueError(f"expected exactly two {SUMMARY_MARKER!r} lines, found {len(parts) - 1}")
    return parts


def summary_block(text: str) -> list[str]:
    """The lines between the two :data:`SUMMARY_MARKER` lines of ``text``."""
    return _summary_parts(text)[1].splitlines()


def replace_summary(text: str, lines: list[str]) -> str:
    """``text`` with its summary block replaced by ``lines``."""
    before, _, after = _summary_parts(text)
    return before + SUMMARY_MARKER + "\n" + "".join(line + "\n" for line in lines) + SUMMARY_MARKER + "\n" + after


def bad_update_drops(df: pd.DataFrame, horizon: int = 3) -> pd.DataFrame:
    """Takeaway 3, per run: Spearman's ρ between the step's bad-update share (A < 0, μ − π ≥ 0.5) and the change of
    training success over the next ``horizon`` steps (ρ < 0: bad updates come before drops), with its p-value."""
    bad = per_run_curve(df, "bad_update/fraction", 0).set_index(["run", "step"])["value"]
    success = per_run_curve(df, "success", 0).set_index(["run", "step"])["value"]
    rows = []
    for run, values in success.groupby(level="run"):
        values = values.droplevel("run")
        change = values.shift(-horizon) - values
        pairs = pd.concat([bad.loc[run] if run in bad.index.get_level_values(0) else pd.Series(dtype=float),
                           change], axis=1, keys=["bad", "change"]).dropna()
        if len(pairs) < 5 or pairs["bad"].nunique() < 2:
            rows.append({"run": run, "rho": np.nan, "p": np.nan, "steps": len(pairs)})
            continue
        result = spearmanr(pairs["bad"], pairs["change"])
        rows.append({"run": run, "rho": float(result.statistic), "p": float(result.pvalue), "steps": len(pairs)})
    return pd.DataFrame(rows)
