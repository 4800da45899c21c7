"""The CPU study's tables: its runs as one long table, each run's outcomes, and the claims scored by paired seeds.

A study directory (``python -m studies.cpu.run``'s ``--out-dir``) holds one folder per task, each with one run
directory per (method, condition, seed)::

    <study>/study.json                      the plan and each run's state
    <study>/<task>/<method>-<condition>-s<seed>/{config.json, metrics.jsonl, eval.jsonl}

Its packed copy (``studies/cpu/data``: ``python -m studies.cpu.pack``) holds ``study.json`` and one
``<task>.parquet`` per task (:mod:`studies.cpu.packed`), whose runs keep the paths they would have in a study
directory. :func:`load_study` reads either into the long table of :func:`~dppo_oat.analysis.runs.load_runs` with
more run columns, ``task`` (its folder), ``condition`` (from the run's name), ``arm_method`` and ``mismatch`` (the
rollout's precision or log-prob noise, from its config). :func:`run_outcomes` reduces each run to the numbers the
study's claims are scored on, and :func:`contrast_table` scores the pre-registered claims of
:mod:`studies.cpu.claims` by paired seeds (t-interval, one-sided and equivalence tests against the margin, Holm over
the primary claims) with the general statistics of :mod:`dppo_oat.analysis.stats`. :mod:`studies.cpu.page` writes
the summary in docs/cpu-study.md from that table.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from dppo_oat.analysis.curves import smooth
from dppo_oat.analysis.degenerate import (
    DEGENERATE,
    arm_flags,
    designed_without_trust_region,
    has_collapsed,
    run_degeneracy,
)
from dppo_oat.analysis.run_checks import DamagedRun
from dppo_oat.analysis.runs import PathLike, label_runs, load_runs, preset_name
from dppo_oat.analysis.stats import (
    MarginTests,
    decide,
    holm,
    margin_tests,
    paired_difference,
    sample_std,
    time_to_threshold,
)
from studies.cpu.claims import (
    COLLAPSE_MIN_DROP,
    COLLAPSE_RATIO,
    CONTRASTS,
    PRIMARY_MIN_PAIRS,
    SWEEP_RULES,
    SWEEP_TARGETS,
    Contrast,
    matched,
    swept,
)
from studies.cpu.packed import is_packed, load_packed, run_config
from studies.cpu.placebo import PLACEBO_LABELS

GROUP = ["task", "variant", "condition"]
"""One row of a study table: a method (the preset's paper name) under one condition on one task."""
ARM = ["task", "condition", "arm_method"]
"""One arm of the study: a method (the study's name of it) under one condition on one task, across its seeds."""
STUDY_RULE = replace(DEGENERATE, collapse_ratio=COLLAPSE_RATIO, collapse_min_drop=COLLAPSE_MIN_DROP)
"""When an arm is flagged (:func:`arm_flag_table`): the library's thresholds with the study's collapse rule
(``COLLAPSE_RULE``)."""
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8", "int6": "int6",
                   "int4": "int4"}


def load_study(study_dir: PathLike) -> pd.DataFrame:
    """Every run of the study as one long table (``run``: ``<task>/<run name>``), with ``task``, ``condition``,
    ``mismatch`` and ``arm_method`` (the study's name of the method: a preset, or ``preset@name=value`` with
    overrides) run columns; ``method`` is the variant."""
    if is_packed(study_dir):
        df = load_packed(study_dir)
    else:
        run_dirs = sorted(Path(study_dir).glob("*/*/config.json"))
        if not run_dirs:
            raise FileNotFoundError(f"no study runs under {study_dir!r}: run python -m studies.cpu.run first")
        df = load_runs([str(path.parent) for path in run_dirs])  # damaged runs are skipped with a warning
    runs = pd.DataFrame([study_columns(path) for path in df["path"].unique()]).set_index("path")
    for column in runs.columns:
        df[column] = df["path"].map(runs[column])
    df["variant"] = df["variant"].where(df["variant_named"] == "", df["variant_named"])
    return label_runs(df.drop(columns="variant_named"))


def study_columns(path: str) -> dict[str, str]:
    """The study's columns of the run at ``path`` (``<study>/<task>/<run name>``): ``run`` (``<task>/<run name>``:
    tasks share run names), ``task``, ``condition``, ``arm_method``, ``mismatch`` (from its config,
    :func:`~studies.cpu.packed.run_config`), and ``variant_named``: :func:`study_variant` of its method."""
    folder = Path(path)
    arm_method = folder.name.split("-", 1)[0]
    return {"path": path, "run": f"{folder.parent.name}/{folder.name}", "task": folder.parent.name,
            "condition": condition_of(folder.name), "arm_method": arm_method,
            "mismatch": mismatch_of(run_config(folder)), "variant_named": study_variant(arm_method)}


def study_variant(arm_method: str) -> str:
    """The report's name of a study method whose runs' configs do not name it as one arm: a calibrated rule (each
    run records its own band, so the variant its config gives differs by seed) is ``<preset> (as strong as <the
    preset it matched>)`` (``held as strong as`` where it is set at every step: ``calibrate_every``) or ``<preset>
    (calibrated to block <target>)``, and the study's placebo presets have their
    labels; ``""`` for any other method (its config's variant stands)."""
    preset, _, overrides = arm_method.partition("@")
    settings = dict(item.partition("=")[::2] for item in filter(None, overrides.split(",")))
    if preset in PLACEBO_LABELS:
        return PLACEBO_LABELS[preset]
    if "calibrate_like" in settings:
        held = "held " if "calibrate_every" in settings else ""
        return f"{preset_name(preset)} ({held}as strong as {preset_name(settings['calibrate_like'])})"
    if "calibrate" in settings:
        return f"{preset_name(preset)} (calibrated to block {float(settings['calibrate']):.0%})"
    return ""


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
    engine's share) at the start and the end; the mean bad-update, masked and IS-truncated fractions; what
    :func:`arm_flag_table` reads: the masked share over the first steps, the step each collapsed run collapsed at,
    and whether its rule has no trust region by design (:func:`~dppo_oat.analysis.degenerate.run_degeneracy`)."""
    rule = replace(STUDY_RULE, sigma=sigma, tail=tail)
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
    runs["collapsed"] = grouped["value"].apply(lambda v: has_collapsed(v.to_numpy(), rule)).astype(bool)
    for name, column in (("mismatch", "mismatch/abs_diff_mean"), ("engine_mismatch", "mismatch/first_abs_diff_mean")):
        values = per_run_curve(df, column, 0).groupby("run")["value"]
        runs[f"{name}_start"] = values.apply(lambda v: _head(v, tail))
        runs[f"{name}_end"] = values.apply(lambda v: _tail(v, tail))
        runs[f"{name}_growth"] = runs[f"{name}_end"] / runs[f"{name}_start"].replace(0, np.nan)
    evals = df[df["metric"] == "eval/success"].sort_values("step").groupby("run")["value"]
    runs["eval_before"], runs["eval_after"] = evals.first(), evals.last()
    learner = df[df["metric"] == "eval/learner_success"].sort_values("step").groupby("run")["value"]
    runs["eval_learner_before"], runs["eval_learner_after"] = learner.first(), learner.last()
    for direction in ("mu_above", "mu_below"):
        runs[f"over_delta_neg_share_{direction}"] = negative_share(df, "over_delta", direction)
    for stretch, steps in SIGN_STRETCHES.items():
        runs[f"sign_gap_{stretch}"] = sign_gap(df, steps)
    for name, column in (("bad_update", "bad_update/fraction"), ("masked", "mask/fraction"),
                         ("is_truncated", "is/truncated_fraction")):
        runs[name] = df[df["metric"] == column].groupby("run")["value"].mean()
    degeneracy = run_degeneracy(df, rule)
    runs["masked_early"] = degeneracy["blocked_early"]
    runs["collapse_step"] = degeneracy["collapse_step"] if metric == "success" else np.nan
    paths = df.drop_duplicates("run").set_index("run")["path"] if "path" in df else pd.Series(dtype=object)
    runs["by_design"] = [by_design(runs.at[run, "algo"], paths.get(run)) for run in runs.index]
    return runs.reset_index()


def by_design(algo: str, path: str | None) -> bool:
    """Whether the rule of the run at ``path`` has no trust region by design
    (:func:`~dppo_oat.analysis.degenerate.designed_without_trust_region`), read from its config where it has one
    (:func:`~studies.cpu.packed.run_config`: a packed run's too), else from its preset ``algo``."""
    try:
        trust_region = run_config(path).get("trust_region") if path is not None else None
    except DamagedRun:
        trust_region = None
    return designed_without_trust_region(algo, trust_region if isinstance(trust_region, dict) else None)


SIGN_STRETCHES = {"early": (1, 10), "late": (26, 50)}
"""The stretches of a 50-step run the sign claim over time compares (``sign_gap_early``, ``sign_gap_late``)."""


def sign_gap(df: pd.DataFrame, steps: tuple[int, int]) -> pd.Series:
    """Per run, the sign difference over steps ``first..last``: the share of Â < 0 among the tokens over δ where
    μ > π minus where μ < π (:func:`negative_share`; NaN where a side logged none)."""
    return (negative_share(df, "over_delta", "mu_above", steps)
            - negative_share(df, "over_delta", "mu_below", steps)).astype(float)


def negative_share(df: pd.DataFrame, family: str, direction: str,
                   steps: tuple[int, int] | None = None) -> pd.Series:
    """Per run, the share of Â < 0 among the tokens of ``family`` (``over_delta``: binary KL to μ above δ;
    ``mask_cell``: blocked) on side ``direction`` of μ − π (``mu_above``: μ > π), pooled over the run's steps, or
    over steps ``first..last`` given as ``steps`` (a ratio of summed per-step shares of the A ≠ 0 tokens; NaN where
    a run logged none)."""
    if steps is not None:
        df = df[df["step"].between(*steps)]

    def summed(cell: str) -> pd.Series:
        rows = df[df["metric"].str.startswith(f"{family}/{cell}_{direction}")]
        return rows.groupby("run")["value"].sum()
    negative, positive = summed("neg_adv"), summed("pos_adv")
    total = negative.add(positive, fill_value=0)
    return (negative.reindex(total.index, fill_value=0) / total.replace(0, np.nan)).astype(float)


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



def arm_values(outcomes: pd.DataFrame, task: str, arm: tuple[str, str], metric: str) -> pd.Series:
    """``metric`` of the runs of one arm ``(method, condition)`` of ``task``, indexed by seed."""
    method, condition = arm
    rows = outcomes[(outcomes["arm_method"] == method) & (outcomes["condition"] == condition)
                    & (outcomes["task"] == task)]
    return rows.set_index("seed")[metric].dropna()


def score_contrast(outcomes: pd.DataFrame, contrast: Contrast) -> dict:
    """One contrast on the study's runs, over the seeds both arms have: both arms' means, the paired difference's
    mean and 95% t-interval, and the one-sided p-values of the claim (``p_above``), its reverse (``p_below``) and the
    arms' equivalence within the margin (``p_equivalent``, TOST); ``identical``: every pair differs by exactly 0.
    Fewer than 2 pairs: NaN, ``not run``."""
    left = arm_values(outcomes, contrast.task, contrast.left, contrast.metric)
    right = arm_values(outcomes, contrast.task, contrast.right, contrast.right_metric or contrast.metric)
    pairs = left.index.intersection(right.index)
    row = {"claim": contrast.claim, "source": contrast.source, "family": contrast.family,
           "experiment": contrast.experiment, "metric": contrast.metric, "right_metric": contrast.right_metric,
           "margin": contrast.margin, "pairs": len(pairs), "seeds": tuple(sorted(pairs)),
           "left_values": tuple(left.loc[pairs]), "right_values": tuple(right.loc[pairs]),
           "left": float(left.loc[pairs].mean()) if len(pairs) else np.nan,
           "right": float(right.loc[pairs].mean()) if len(pairs) else np.nan}
    if len(pairs) < 2:
        return {**row, "difference": np.nan, "ci_low": np.nan, "ci_high": np.nan, "p_above": np.nan,
                "p_below": np.nan, "p_equivalent": np.nan, "identical": False}
    difference = paired_difference(left.loc[pairs].to_numpy(), right.loc[pairs].to_numpy())
    tests = margin_tests(difference, contrast.margin)
    return {**row, "difference": difference.mean, "ci_low": difference.low, "ci_high": difference.high,
            "p_above": tests.above, "p_below": tests.below, "p_equivalent": tests.equivalent,
            "identical": difference.identical}


P_COLUMNS = ("p_above", "p_below", "p_equivalent")


def adjusted_for_family(table: pd.DataFrame) -> pd.DataFrame:
    """``*_adjusted`` p-values: Holm over the primary claims of one experiment that ran with at least
    :data:`PRIMARY_MIN_PAIRS` pairs (each of the three tests its own family), counting one comparison once: a claim
    scored on the same paired numbers as an earlier one (``same_as``) is not a comparison of its own and takes that
    one's adjusted p-values. Every other claim keeps its own p-values and, once it has run, counts as exploratory
    (``family`` rewritten so; a primary claim not run yet keeps its family, as it was written down).
    ``holm_size``: the distinct comparisons of its correction."""
    table = table.copy()
    primary = (table["family"] == "primary") & (table["pairs"] >= PRIMARY_MIN_PAIRS) & ~table["identical"]
    table.loc[(table["family"] == "primary") & ~primary & (table["pairs"] > 0), "family"] = "exploratory"
    table["holm_size"] = 0
    for column in P_COLUMNS:
        table[f"{column}_adjusted"] = table[column]
    distinct = primary & (table["same_as"] == "")
    for _, rows in table[distinct].groupby("experiment"):
        table.loc[rows.index, "holm_size"] = len(rows)
        for column in P_COLUMNS:
            table.loc[rows.index, f"{column}_adjusted"] = holm(rows[column].to_numpy())
    first = {claim: index for index, claim in table["claim"].items()}
    for index in table.index[primary & (table["same_as"] != "")]:
        origin = first[table.at[index, "same_as"]]
        for column in ("holm_size", *(f"{c}_adjusted" for c in P_COLUMNS)):
            table.at[index, column] = table.at[origin, column]
    return table


def pooled_holm(table: pd.DataFrame, claims: tuple[str, ...]) -> pd.DataFrame:
    """``claims`` of the contrast ``table`` (:func:`contrast_table`) Holm-corrected together, one family per test as
    in :func:`adjusted_for_family`: for exploratory claims that ask one question of the same reference runs in two
    experiments (each rule against PG-IS in ``matched`` and ``matched_more``), whose verdicts as scored are
    uncorrected. A claim that has not run or gave identical runs is no comparison of the family, and one scored on
    an earlier claim's numbers (``same_as``) counts once, as that one. Per claim (the index): ``holm_size``, the
    three ``*_adjusted`` p-values and ``verdict`` at them (:func:`contrast_verdict`)."""
    rows = table.set_index("claim").loc[list(claims)].copy()
    ran = (rows["pairs"] >= 2) & ~rows["identical"].astype(bool)
    counted = ran & ~rows["same_as"].isin(rows.index)
    for column in P_COLUMNS:
        rows[f"{column}_adjusted"] = holm(rows[column].where(counted).to_numpy(dtype=float))
        repeated = ran & ~counted
        rows.loc[repeated, f"{column}_adjusted"] = rows.loc[rows.loc[repeated, "same_as"], f"{column}_adjusted"].values
    rows["holm_size"] = int(counted.sum())
    rows["verdict"] = rows.apply(contrast_verdict, axis=1)
    return rows[["holm_size", *(f"{c}_adjusted" for c in P_COLUMNS), "verdict"]]


def contrast_verdict(row) -> str:
    """``not run`` (under 2 pairs), ``identical runs`` (the two arms gave the same number on every seed: no
    verdict), else :func:`~dppo_oat.analysis.stats.decide` on the adjusted p-values at one-sided level 0.025."""
    if row["pairs"] < 2:
        return "not run"
    if row["identical"]:
        return "identical runs"
    return decide(MarginTests(row["p_above_adjusted"], row["p_below_adjusted"], row["p_equivalent_adjusted"]))


def same_runs_as(table: pd.DataFrame) -> list[str]:
    """For each contrast, the first earlier claim scored on exactly the same paired numbers (different arms whose
    runs coincide, e.g. MiniRL and GRPO-ClipHigher where π_θ' = μ), else ``""``: its line is then not repeated."""
    first_of, earlier = {}, []
    for row in table.itertuples():
        key = (row.task, row.metric, row.margin, row.seeds, row.left_values, row.right_values)
        earlier.append(first_of.get(key, "") if row.pairs >= 2 else "")
        first_of.setdefault(key, row.claim)
    return earlier


def contrast_table(outcomes: pd.DataFrame, contrasts: tuple[Contrast, ...] = CONTRASTS) -> pd.DataFrame:
    """Every contrast scored (:func:`score_contrast`) in the order they were written down, with ``same_as`` (the
    earlier claim it duplicates, if any), Holm-adjusted over the distinct primary comparisons of each experiment,
    its verdict, ``left_flag`` / ``right_flag``: why that arm cannot be read as a trust region
    (:func:`arm_flag_table`; empty when it can, or has not run), and ``left_name`` / ``right_name`` and
    ``left_condition`` / ``right_condition``: the arm's method as the report names it, and its condition."""
    table = pd.DataFrame([{**score_contrast(outcomes, c), "task": c.task} for c in contrasts])
    table["same_as"] = same_runs_as(table)
    table = adjusted_for_family(table)
    table["verdict"] = table.apply(contrast_verdict, axis=1)
    flags = arm_flag_table(outcomes)
    for side in ("left", "right"):
        arms = [(c.task, getattr(c, side)[1], getattr(c, side)[0]) for c in contrasts]
        table[f"{side}_flag"] = [flags["flag"].get(arm, "") for arm in arms]
        table[f"{side}_name"] = [flags["variant"].get(arm, arm[2]) for arm in arms]
        table[f"{side}_condition"] = [arm[1] for arm in arms]
    return table


def arm_flag_table(outcomes: pd.DataFrame) -> pd.DataFrame:
    """One row per arm (:data:`ARM`), indexed by it: its name (``variant``), runs, mean masked share over the run
    and over its first steps, the runs that collapsed within :data:`STUDY_RULE`'s first steps, and ``flag``: why
    the arm cannot be read as a trust region, or empty (:func:`~dppo_oat.analysis.degenerate.arm_flags`)."""
    runs = outcomes.rename(columns={"masked": "blocked", "masked_early": "blocked_early"})
    table = arm_flags(runs, ARM, STUDY_RULE)
    table.insert(0, "variant", runs.groupby(ARM, sort=False)["variant"].first())
    return table.drop(columns="by_design")


STRETCHES = (0, 10, 25, 40, 50)
"""Stretches of a 50-step run the per-token tables average over: steps 1–10, 11–25, 26–40, 41–50."""


def cell_table(df: pd.DataFrame, family: str, conditions: tuple[str, ...]) -> pd.DataFrame:
    """The ``family`` shares (``mask_cell``: tokens the mask blocked; ``over_delta``: tokens whose binary KL to μ
    exceeds δ) of the A ≠ 0 tokens, in %, per condition, arm and cell (sign of Â, side of μ − π, and for
    ``mask_cell`` the μ bucket), by stretch of the run (:data:`STRETCHES`): means over steps and seeds. Cells that
    are 0 in every column are left out."""
    rows = df[df["condition"].isin(conditions) & df["metric"].str.startswith(f"{family}/")]
    if rows.empty:
        return pd.DataFrame()
    labels = [f"{low + 1}-{high}" for low, high in itertools.pairwise(STRETCHES)]
    rows = rows.assign(cell=rows["metric"].str.removeprefix(f"{family}/"),
                       stretch=pd.cut(rows["step"], STRETCHES, labels=labels))
    table = 100 * rows.pivot_table(index=["condition", "arm_method", "cell"], columns="stretch", values="value",
                                   aggfunc="mean", observed=False)
    return table[(table.fillna(0) != 0).any(axis=1)]


def negative_shares(outcomes: pd.DataFrame, condition: str, method: str) -> pd.DataFrame:
    """Per seed, the share of Â < 0 among the tokens over δ where μ > π and where μ < π (:func:`negative_share`)
    in one arm's runs, and their difference."""
    rows = outcomes[(outcomes["condition"] == condition) & (outcomes["arm_method"] == method)].set_index("seed")
    table = rows[["over_delta_neg_share_mu_above", "over_delta_neg_share_mu_below"]].sort_index()
    return table.assign(difference=table.iloc[:, 0] - table.iloc[:, 1])


def sign_shares_by_stretch(df: pd.DataFrame, condition: str, method: str,
                           stretches: tuple[tuple[int, int], ...] = ((1, 10), (26, 50), (1, 50))) -> pd.DataFrame:
    """The sign claim by stretch of the run: per stretch ``(first, last)`` of steps, over one arm's runs, the share
    of Â < 0 among the tokens over δ where μ > π and where μ < π (:func:`negative_share`, means over seeds), their
    paired difference with its 95% t-interval, and the seeds where it is positive."""
    rows = df[(df["condition"] == condition) & (df["arm_method"] == method)]
    table = []
    for first, last in stretches:
        above, below = (negative_share(rows, "over_delta", side, (first, last)) for side in ("mu_above", "mu_below"))
        pairs = above.dropna().index.intersection(below.dropna().index)
        if len(pairs) < 2:
            continue
        difference = paired_difference(above.loc[pairs].to_numpy(), below.loc[pairs].to_numpy())
        table.append({"steps": f"{first}-{last}", "mu_above": above.loc[pairs].mean(),
                      "mu_below": below.loc[pairs].mean(), "difference": difference.mean, "low": difference.low,
                      "high": difference.high, "pairs": difference.pairs,
                      "higher_in": int((above.loc[pairs] > below.loc[pairs]).sum())})
    return pd.DataFrame(table).set_index("steps") if table else pd.DataFrame()


HALVES = {"A<0 half (Â < 0, μ > π)": "mask_cell/neg_adv_mu_above", "A>0 half (Â > 0, μ < π)":
          "mask_cell/pos_adv_mu_below"}
"""The two cells a μ-anchored mask can block, by the prefix of their ``mask_cell`` metrics (one per μ bucket)."""


def blocked_by_half(df: pd.DataFrame, conditions: tuple[str, ...]) -> pd.DataFrame:
    """Per arm of ``conditions``: the share of the A ≠ 0 tokens its rule blocked in each half a μ-anchored mask can
    block (:data:`HALVES`, its μ buckets summed), in every other cell, and in all (``mask/fraction``), in %: means
    over steps and seeds."""
    rows = df[df["condition"].isin(conditions)]
    cells = rows[rows["metric"].str.startswith("mask_cell/")]
    per_step = cells.assign(half=cells["metric"].map(lambda m: next(
        (name for name, prefix in HALVES.items() if m.startswith(prefix)), "other cells")))
    summed = per_step.groupby(["condition", "arm_method", "half", "run", "step"])["value"].sum()
    table = 100 * summed.groupby(["condition", "arm_method", "half"]).mean().unstack("half")
    total = rows[rows["metric"] == "mask/fraction"].groupby(["condition", "arm_method"])["value"].mean()
    return table.reindex(columns=[*HALVES, "other cells"]).fillna(0.0).assign(all=100 * total)


CALIBRATED_STEPS = (2, None)
"""The steps a calibrated arm trains at its calibrated band: step 1 runs at the preset's own band, on the batch the
band is calibrated on, and the calibrated band acts from step 2 to the end."""


def blocked_per_run(df: pd.DataFrame, conditions: tuple[str, ...],
                    steps: tuple[int, int | None] = (1, None)) -> pd.Series:
    """Per run of ``conditions``, by (condition, arm_method, seed): the share of the A ≠ 0 tokens its rule blocked
    (``mask/fraction``), its mean over steps ``first..last`` (``last`` None: to the run's end)."""
    first, last = steps
    rows = df[df["condition"].isin(conditions) & (df["metric"] == "mask/fraction")]
    rows = rows[rows["step"] >= first] if last is None else rows[rows["step"].between(first, last)]
    return rows.groupby(["condition", "arm_method", "seed"])["value"].mean()


def blocked_share(df: pd.DataFrame, conditions: tuple[str, ...],
                  steps: tuple[int, int | None] = (1, None)) -> pd.Series:
    """Per arm of ``conditions``, by (condition, arm_method): its runs' blocked share over ``steps``
    (:func:`blocked_per_run`), mean over seeds; over every step, the outcomes' ``masked`` mean over seeds."""
    return blocked_per_run(df, conditions, steps).groupby(["condition", "arm_method"]).mean()


def blocked_ratio_range(per_run: pd.Series, condition: str, methods: tuple[str, ...],
                        reference: str = "dppo_binary_kl") -> tuple[float, float]:
    """The lowest and the highest, over ``methods`` and seeds under ``condition``, of a run's blocked share
    (``per_run``: :func:`blocked_per_run`) divided by the ``reference`` run's of the same seed: how far arms
    calibrated to ``reference``'s first-step share stayed from its share (over :data:`CALIBRATED_STEPS`, once their
    bands acted). NaN, NaN without a pair."""
    if condition not in per_run.index.get_level_values("condition"):
        return np.nan, np.nan
    runs = per_run.loc[condition]
    present = set(runs.index.get_level_values("arm_method"))
    if reference not in present:
        return np.nan, np.nan
    ratios = [runs.loc[method] / runs.loc[reference] for method in methods if method in present]
    ratios = pd.concat(ratios).replace([np.inf, -np.inf], np.nan).dropna() if ratios else pd.Series(dtype=float)
    return (float(ratios.min()), float(ratios.max())) if len(ratios) else (np.nan, np.nan)


HELD_STEPS = {"mech-int4": (1, None), "field-mb4": (2, None)}
"""The steps a held band acts on, per v6 condition: under the int4 copy at one step per rollout π_θ ≠ μ before the
update, so every band, the first included, is set on its own step's batch; under staleness alone π_θ = μ before the
update, so the band is set on the update's own loss calls and acts from the next step (step 1 runs at the preset's
own band)."""
HELD_WITHIN = 1.25
"""v6's design: a held arm's blocked share over the run within this factor (either way) of DPPO-Binary-KL's own runs'
in the same condition."""


def held_strength(df: pd.DataFrame, condition: str, methods: tuple[str, ...],
                  reference: str = "dppo_binary_kl") -> pd.DataFrame:
    """Per held arm of ``methods`` under ``condition`` (over :data:`HELD_STEPS`): what its band blocked
    (``mask/fraction``) beside what it was set to block on its own batches (``band/target``: ``reference``'s mask
    there) and beside ``reference``'s own runs (``reference %``, the same steps); means over seeds, in %. ``to target``
    and ``to reference`` divide the blocked share by each; ``lowest``/``highest`` bound the per-seed ratio to
    ``reference``'s run of the same seed; ``within`` says whether ``to reference`` is inside :data:`HELD_WITHIN`."""
    first, last = HELD_STEPS[condition]
    rows = df[(df["condition"] == condition) & df["metric"].isin(("mask/fraction", "band/target"))]
    rows = rows[rows["step"] >= first] if last is None else rows[rows["step"].between(first, last)]
    per_run = rows.pivot_table(index=["arm_method", "seed"], columns="metric", values="value", aggfunc="mean")
    if reference not in per_run.index.get_level_values("arm_method"):
        return pd.DataFrame()
    own = per_run.loc[reference, "mask/fraction"]
    table = []
    for method in methods:
        if method not in per_run.index.get_level_values("arm_method"):
            continue
        runs = per_run.loc[method]
        paired = (runs["mask/fraction"] / own.reindex(runs.index)).dropna()
        blocked, target = runs["mask/fraction"].mean(), runs.get("band/target", pd.Series(dtype=float)).mean()
        table.append({"arm_method": method, "runs": len(runs), "blocked %": 100 * blocked,
                      "target %": 100 * target, "reference %": 100 * own.mean(), "to target": blocked / target,
                      "to reference": blocked / own.mean(), "lowest": paired.min(), "highest": paired.max()})
    table = pd.DataFrame(table).set_index("arm_method") if table else pd.DataFrame()
    if len(table):
        table["within"] = table["to reference"].between(1 / HELD_WITHIN, HELD_WITHIN)
    return table


def held_out_table(outcomes: pd.DataFrame, conditions: tuple[str, ...]) -> pd.DataFrame:
    """Per arm of ``conditions``: runs, AUC, held-out success of the rollout copy and of the fp32 learner at the
    start and the end (means over seeds), the seeds whose copy ended below its start, and collapses."""
    rows = outcomes[outcomes["condition"].isin(conditions)]
    return rows.assign(fell=rows["eval_after"] < rows["eval_before"]).groupby(["condition", "arm_method"]).agg(
        runs=("seed", "count"), auc=("auc", "mean"), copy_start=("eval_before", "mean"),
        copy_end=("eval_after", "mean"), learner_start=("eval_learner_before", "mean"),
        learner_end=("eval_learner_after", "mean"), ended_lower=("fell", "sum"), collapsed=("collapsed", "sum"))


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


def calibration_table(df: pd.DataFrame, outcomes: pd.DataFrame, conditions: tuple[str, ...],
                      reference: str = "dppo_binary_kl") -> pd.DataFrame:
    """Per calibrated arm of ``conditions`` (its runs' ``config.json`` ``calibration`` records): the band it moved,
    the calibrated band's fields (medians over seeds), on step 1 the share ``reference`` blocked (the target), what
    the calibrated band blocked and what the preset's own band would have, and over the run its mean blocked share
    beside ``reference``'s (``mask/fraction``; %, means over seeds)."""
    rows = []
    for run, path in df[df["condition"].isin(conditions)].drop_duplicates("run")[["run", "path"]].itertuples(
            index=False):
        record = run_config(path).get("calibration")
        if isinstance(record, dict):
            rows.append({"run": run, "band": record["band"], **{f"after {k}": v for k, v in record["after"].items()},
                         "target %": 100 * record["target"], "achieved %": 100 * record["achieved"],
                         "preset's band %": 100 * record["before_fraction"]})
    if not rows:
        return pd.DataFrame()
    runs = pd.DataFrame(rows).merge(outcomes[["run", "condition", "variant", "masked"]], on="run")
    table = runs.groupby(["condition", "variant", "band"]).agg(
        {**{c: "median" for c in runs.columns if c.startswith("after ")}, "target %": "mean", "achieved %": "mean",
         "preset's band %": "mean", "masked": "mean", "run": "count"}).rename(columns={"run": "runs"})
    table["blocked over the run %"] = 100 * table.pop("masked")
    own = outcomes[outcomes["arm_method"] == reference].groupby("condition")["masked"].mean()
    table[f"{reference} over the run %"] = 100 * table.index.get_level_values("condition").map(own)
    return table


STRENGTH_CONDITION = "mech-int4"
"""The condition of the ``band_sweep`` experiment (and of the ``matched`` runs it compares with)."""


def sweep_arms() -> dict[str, dict[str, str]]:
    """The arms :func:`strength_table` compares: per rule of ``band_sweep`` (its label), its method at
    DPPO-Binary-KL's strength (``matched``) and at each target of the sweep (``2%``, ``8%``)."""
    return {label: {"matched": matched(preset, both),
                    **{f"{float(target):.0%}": swept(preset, both, target) for target in SWEEP_TARGETS}}
            for preset, both, label in SWEEP_RULES}


def strength_table(outcomes: pd.DataFrame, condition: str, arms: dict[str, dict[str, str]]) -> pd.DataFrame:
    """Strength against outcome: per rule of ``arms`` (``{rule: {strength: arm method}}``) and strength, under
    ``condition``, the runs, the share of A ≠ 0 tokens its band blocked over the run (``mask/fraction``, %, mean over
    seeds), the AUC's mean and the half-width of its 95% t-interval over seeds, held-out success at the end and the
    collapses. An arm without runs is left out."""
    from scipy.stats import ttest_1samp

    rows = []
    for rule, strengths in arms.items():
        for strength, method in strengths.items():
            runs = outcomes[(outcomes["condition"] == condition) & (outcomes["arm_method"] == method)]
            if runs.empty:
                continue
            auc = runs["auc"]
            interval = ttest_1samp(auc, 0.0).confidence_interval(0.95) if len(runs) > 1 else None
            half = (interval.high - interval.low) / 2 if interval is not None else np.nan
            rows.append({"rule": rule, "strength": strength, "runs": len(runs),
                         "blocked %": 100 * runs["masked"].mean(),
                         "auc": auc.mean(), "auc ± 95%": half, "held-out end": runs["eval_after"].mean(),
                         "collapsed": int(runs["collapsed"].sum())})
    return pd.DataFrame(rows).set_index(["rule", "strength"]) if rows else pd.DataFrame()


def placebo_table(df: pd.DataFrame, condition: str = "v5-fp32") -> pd.DataFrame:
    """Per arm of ``condition``: the share of the A ≠ 0 tokens it blocked (``mask/fraction``) and, per sign of Â and
    μ bucket, the blocked tokens on either side of μ − π summed (with an fp32 sampler the side is rounding), in %:
    means over steps and seeds; beside them, the rates the placebo was set to
    (:data:`~studies.cpu.placebo.PLACEBO_RATES`)."""
    from dppo_oat.trust_region.metrics import MU_BUCKETS
    from studies.cpu.placebo import PLACEBO_RATES

    rows = df[df["condition"] == condition]
    if rows.empty:
        return pd.DataFrame()
    columns = {"all": ["mask/fraction"]}
    for adv in ("neg_adv", "pos_adv"):
        for _, _, bucket in MU_BUCKETS:
            columns[f"{adv} {bucket}"] = [f"mask_cell/{adv}_{d}_{bucket}" for d in ("mu_above", "mu_below")]
    per_step = rows.pivot_table(index=["arm_method", "run", "step"], columns="metric", values="value")
    table = pd.DataFrame({name: per_step[[m for m in metrics if m in per_step]].sum(axis=1)
                          for name, metrics in columns.items()})
    table = 100 * table.groupby(level="arm_method").mean()
    rates = {f"{adv} {bucket}": 100 * rate for adv, side in (("neg_adv", "negative"), ("pos_adv", "positive"))
             for bucket, rate in PLACEBO_RATES[side].items()}
    set_to = pd.DataFrame([{"all": sum(rate for name, rate in rates.items() if name.startswith(adv)),
                            **{k: (v if k.startswith(adv) else 0.0) for k, v in rates.items()}}
                           for adv in ("neg_adv", "pos_adv")], index=["set: placebo_neg", "set: placebo_pos"])
    return pd.concat([table, set_to])
