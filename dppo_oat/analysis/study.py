"""Tables of a study: many methods × conditions × seeds, as ``scripts/cpu_study.py`` writes them.

A study directory holds one folder per task, each with one run directory per (method, condition, seed)::

    <study>/study.json                      the plan and each run's state
    <study>/<task>/<method>-<condition>-s<seed>/{config.json, metrics.jsonl, eval.jsonl}   (or *.jsonl.gz, packed)

:func:`load_study` reads it into the long table of :func:`~dppo_oat.analysis.runs.load_runs` with three more run
columns, ``task`` (its folder), ``condition`` (from the run's name) and ``mismatch`` (the rollout's precision or
log-prob noise, from its config). :func:`run_outcomes` reduces each run to the numbers the study's claims are scored
on, :func:`contrast_table` scores the pre-registered :data:`CONTRASTS` by paired seeds (t-interval, one-sided and
equivalence tests against the margin, Holm over the primary claims), and :func:`summary_lines` writes the summary
in docs/cpu-study.md from that table.
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
from dppo_oat.analysis.stats import (MarginTests, decide, holm, margin_tests, paired_difference,
                                     sample_std, time_to_threshold)

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
    learner = df[df["metric"] == "eval/learner_success"].sort_values("step").groupby("run")["value"]
    runs["eval_learner_before"], runs["eval_learner_after"] = learner.first(), learner.last()
    for direction in ("mu_above", "mu_below"):
        runs[f"over_delta_neg_share_{direction}"] = negative_share(df, "over_delta", direction)
    for name, column in (("bad_update", "bad_update/fraction"), ("masked", "mask/fraction"),
                         ("is_truncated", "is/truncated_fraction")):
        runs[name] = df[df["metric"] == column].groupby("run")["value"].mean()
    return runs.reset_index()


def negative_share(df: pd.DataFrame, family: str, direction: str) -> pd.Series:
    """Per run, the share of Â < 0 among the tokens of ``family`` (``over_delta``: binary KL to μ above δ;
    ``mask_cell``: blocked) on side ``direction`` of μ − π (``mu_above``: μ > π), pooled over the run's steps (a
    ratio of summed per-step shares of the A ≠ 0 tokens; NaN where a run logged none)."""
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


# ---------------------------------------------------------------------------------------------------- study v2
# Written down before the runs of scripts/cpu_study.py's ``mismatch`` and ``staleness`` experiments, and not changed
# after: each claim, the per-run number it is scored on, the arms compared seed by seed, and the margin.

COLLAPSE_RULE = (f"final training success (mean of the last 10% of steps) below {COLLAPSE_RATIO} × its smoothed "
                 f"peak and at least {COLLAPSE_MIN_DROP} under it")
THRESHOLD = 0.35
"""Time to threshold: first step at which the smoothed training success reaches 0.35 (the shipped policy starts
near 0.25); a run that never does is censored at its last step."""
AUC_MARGIN = 0.02
"""Two arms' mean training success over the run (the area under the curve per step) must differ by more than this
for the claim to hold or be refuted, and by less than this (both ways) to be equivalent."""
PRIMARY_MIN_PAIRS = 8
"""A primary claim needs at least this many paired seeds; fewer are scored, and marked, as exploratory."""


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
    family: str = "exploratory"
    """``primary``: a claim the design tests, Holm-corrected with the other primary claims of its ``experiment``;
    ``exploratory``: uncorrected, reported as such."""
    experiment: str = ""
    """The experiment whose primary claims are Holm-corrected together (each experiment was designed, and its
    claims written, on its own)."""
    right_metric: str = ""
    """The right arm's number when it is not ``metric`` (a claim within one arm's runs compares two of their
    numbers, e.g. held-out success at the start and at the end); empty: ``metric``."""
    played_before: tuple[tuple[str, str], ...] = ()
    """Arms whose runs were played before this claim was written, declared with it (a reference reused from an
    earlier experiment): the provenance test checks that the claim was committed before every other arm's runs."""


HELD_OUT_MARGIN = 0.05
"""Held-out success is measured on 100 episodes per run: claims on it need a difference above five of them."""
SHARE_MARGIN = 0.05
"""A claim on a share of tokens (of Â < 0 among the tokens over δ) needs a difference above five points."""
REGIME = "Takeaway 2 in its regime (int4 copy, four quarter-batch steps per rollout)"
REGIME_CONTRASTS = (
    Contrast(f"{REGIME}: the DPPO-KL mask anchored on μ beats the same mask on the recomputed π_θ'", "Takeaway 2",
             ("dppo_binary_kl", "mb4-int4"), ("dppo_binary_kl_recompute", "mb4-int4"), family="primary",
             experiment="regime"),
    Contrast(f"{REGIME}: the DPPO-TV mask anchored on μ beats the same mask on the recomputed π_θ'", "Takeaway 2",
             ("dppo_binary_tv", "mb4-int4"), ("dppo_binary_tv_recompute", "mb4-int4"), family="primary",
             experiment="regime"),
    Contrast(f"{REGIME}: DPPO-Binary-KL (anchored on μ) beats MiniRL (its clip on π_θ')", "Takeaway 2",
             ("dppo_binary_kl", "mb4-int4"), ("minirl", "mb4-int4")),
    Contrast(f"{REGIME}: DPPO-Binary-KL beats PG-IS", "fig:sanity_test",
             ("dppo_binary_kl", "mb4-int4"), ("pg_is", "mb4-int4")),
    Contrast(f"{REGIME}: DPPO-Binary-TV beats PG-IS", "fig:sanity_test",
             ("dppo_binary_tv", "mb4-int4"), ("pg_is", "mb4-int4")),
)
"""The ``regime`` experiment's claims (eight seeds): each μ-anchored DPPO mask against its recomputed-anchor twin
(primary: the same rule, only the anchor differs), and against MiniRL and PG-IS (exploratory)."""
MECHANISM = "why the μ-anchored mask cost learning under int4 (one step per rollout)"
MECHANISM_CONTRASTS = (
    Contrast(f"{MECHANISM}: in PG-IS runs (no mask acts), among tokens whose binary KL to μ exceeds δ 0.05, more "
             "have Â < 0 where the int4 copy over-weights the token (μ > π) than where it under-weights it",
             "mechanism: int4's extra mass goes to wrong moves", ("pg_is", "mech-int4"), ("pg_is", "mech-int4"),
             "over_delta_neg_share_mu_above", SHARE_MARGIN, family="primary", experiment="mechanism",
             right_metric="over_delta_neg_share_mu_below"),
    Contrast(f"{MECHANISM}: PG-IS beats DPPO-Binary-KL (the takeaway2 result, on runs of its own)",
             "mechanism: the mask costs learning", ("pg_is", "mech-int4"), ("dppo_binary_kl", "mech-int4"),
             family="primary", experiment="mechanism"),
    Contrast(f"{MECHANISM}: PG-IS beats the mask's A<0 half alone (blocks A<0 where μ > π)",
             "mechanism: the mask's halves", ("pg_is", "mech-int4"), ("dppo_binary_kl_neg", "mech-int4"),
             family="primary", experiment="mechanism"),
    Contrast(f"{MECHANISM}: PG-IS beats the mask's A>0 half alone (blocks A>0 where μ < π)",
             "mechanism: the mask's halves", ("pg_is", "mech-int4"), ("dppo_binary_kl_pos", "mech-int4"),
             family="primary", experiment="mechanism"),
    Contrast(f"{MECHANISM}: DPPO-Binary-KL under an int4 grid redrawn at every re-sync beats it under the fixed grid",
             "mechanism: a persistent quantisation error", ("dppo_binary_kl", "mech-int4-redraw"),
             ("dppo_binary_kl", "mech-int4"), family="primary", experiment="mechanism"),
    Contrast(f"{MECHANISM}: under noise on log μ that makes the mask block about as many tokens (fp32 sampler), "
             "PG-IS beats DPPO-Binary-KL (the mechanism predicts not: equivalent)", "mechanism: the noise control",
             ("pg_is", "mech-noise"), ("dppo_binary_kl", "mech-noise"), family="primary", experiment="mechanism"),
    Contrast(f"{MECHANISM}: DPPO-Binary-KL's fp32 learner (not its int4 copy) loses held-out success over the run",
             "mechanism: the fp32 learner degrades", ("dppo_binary_kl", "mech-int4"), ("dppo_binary_kl", "mech-int4"),
             "eval_learner_before", HELD_OUT_MARGIN, family="primary", experiment="mechanism",
             right_metric="eval_learner_after"),
    Contrast(f"{MECHANISM}: PG-IS's fp32 learner ends above DPPO-Binary-KL's on held-out success",
             "mechanism: the fp32 learner degrades", ("pg_is", "mech-int4"), ("dppo_binary_kl", "mech-int4"),
             "eval_learner_after", HELD_OUT_MARGIN),
    Contrast(f"{MECHANISM}: DPPO-Binary-KL's fp32 learner ends above its own int4 copy on held-out success",
             "mechanism: the fp32 learner degrades", ("dppo_binary_kl", "mech-int4"), ("dppo_binary_kl", "mech-int4"),
             "eval_learner_after", HELD_OUT_MARGIN, right_metric="eval_after"),
    Contrast(f"{MECHANISM}: the mask's A<0 half alone beats its A>0 half alone", "mechanism: the mask's halves",
             ("dppo_binary_kl_neg", "mech-int4"), ("dppo_binary_kl_pos", "mech-int4")),
    Contrast(f"{MECHANISM}: PG-IS with the fp32 sampler and the matched noise beats PG-IS under the int4 copy (what "
             "sampling from the int4 copy itself costs, with no mask)", "mechanism: the noise control",
             ("pg_is", "mech-noise"), ("pg_is", "mech-int4")),
)
"""The mechanism experiments' claims (eight seeds), written before their runs. Primary (Holm-corrected together):
the sign correlation among tokens over δ in PG-IS runs, the mask's cost replicated, each half's cost, the redrawn
grid, the noise control, and the fp32 learner's own loss. Exploratory: where the learner ends against PG-IS's and
against its own int4 copy, the halves against each other, and the noisy fp32 sampler against the int4 one."""

FRONTIER = "the field after DPPO under an int4 copy (one step per rollout)"
FRONTIER_ARMS = (("ipo", "the symmetric band (prime-rl's IPO)"), ("trm_max", "TRM-Max"), ("gspo", "GSPO"),
                 ("sapo", "SAPO"))
"""The ``frontier`` experiment's new arms, each with its name in a claim."""


def frontier_contrasts(arms: tuple[tuple[str, str], ...], experiment: str, condition: str = "mech-int4",
                       setting: str = FRONTIER, references_played_before: bool = True) -> tuple[Contrast, ...]:
    """A field experiment's claims under ``condition``: each arm against DPPO-Binary-KL (primary, Holm over
    ``experiment``), then against PG-IS (exploratory). With ``references_played_before``, both references are an
    earlier experiment's runs of the condition, declared as played before the claims; else the experiment plays them
    in its own sitting."""
    against = (("dppo_binary_kl", "DPPO-Binary-KL", "primary"), ("pg_is", "PG-IS", "exploratory"))
    return tuple(Contrast(f"{setting}: {label} beats {name}", "the field after DPPO", (method, condition),
                          (reference, condition), family=family, experiment=experiment if family == "primary" else "",
                          played_before=((reference, condition),) if references_played_before else ())
                 for reference, name, family in against for method, label in arms)


FRONTIER_CONTRASTS = frontier_contrasts(FRONTIER_ARMS, "frontier")
"""The ``frontier`` experiment's claims (eight seeds), written before its new arms' runs: each later rule against
DPPO-Binary-KL (primary, Holm-corrected together: each source presents its rule as an improvement on token-level
clipping or masking) and against PG-IS (exploratory: no trust region, the best arm of the ``mechanism`` runs). The
two reference arms are the ``mechanism`` experiment's runs of the same condition, policy and seeds, played before
these claims were written."""

FRONTIER_MORE_ARMS = (("trm_avg", "TRM-Avg"), ("opsm", "DeepSeek-V3.2's off-policy sequence mask"), ("vaco", "VACO"),
                      ("minpro", "MinPRO"))
"""The ``frontier_more`` experiment's new arms: the field's other four presets, under the same condition."""
FRONTIER_MORE_CONTRASTS = frontier_contrasts(FRONTIER_MORE_ARMS, "frontier_more")
"""The ``frontier_more`` experiment's claims (eight seeds), written after the ``frontier`` experiment's results and
before its own runs, as those were: each rule against DPPO-Binary-KL (primary, Holm-corrected over these four, a
family of their own) and against PG-IS (exploratory), on the same reference runs."""

FRONTIER_STALE = "the field after DPPO under staleness (four quarter-batch steps per rollout, fp32 copy)"
FRONTIER_STALE_ARMS = FRONTIER_ARMS + FRONTIER_MORE_ARMS
"""The ``frontier_stale`` experiment's arms: the eight field presets of the two int4 experiments."""
FRONTIER_STALE_CONTRASTS = frontier_contrasts(FRONTIER_STALE_ARMS, "frontier_stale", "field-mb4", FRONTIER_STALE,
                                              references_played_before=False)
"""The ``frontier_stale`` experiment's claims (eight seeds), written after the two int4 experiments' results and
before any of its runs: under staleness alone (an fp32 copy, four quarter-batch steps per rollout, the condition of
fig:sanity_test), each field preset against DPPO-Binary-KL (primary, Holm-corrected over the eight as a family of
their own: each source presents its rule as a better trust region than token-level clipping or masking) and against
PG-IS (exploratory). Both references are played in the experiment's own sitting."""


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
    # Added before the runs of the ``takeaway2`` experiment (eight seeds: its first three claims are primary).
    Contrast("under a binding engine mismatch (int4 rollout), the DPPO-KL mask anchored on μ beats the same mask on "
             "the recomputed π_θ'", "Takeaway 2", ("dppo_binary_kl", "mb1-int4"),
             ("dppo_binary_kl_recompute", "mb1-int4"), family="primary", experiment="takeaway2"),
    Contrast("under a binding engine mismatch (int4 rollout), DPPO-Binary-KL (anchored on μ) beats MiniRL (its clip "
             "anchored on π_θ')", "Takeaway 2", ("dppo_binary_kl", "mb1-int4"), ("minirl", "mb1-int4"),
             family="primary", experiment="takeaway2"),
    Contrast("under a binding engine mismatch (int4 rollout), DPPO-Binary-KL beats PG-IS", "Takeaway 1",
             ("dppo_binary_kl", "mb1-int4"), ("pg_is", "mb1-int4"), family="primary", experiment="takeaway2"),
    Contrast("under a binding engine mismatch (int4 rollout), truncated IS (MiniRL-TIS) beats MiniRL", "Takeaway 2",
             ("minirl_tis", "mb1-int4"), ("minirl", "mb1-int4")),
    # Added before the runs of the ``later_async`` experiment.
    Contrast("asynchronous rollouts two updates stale: DRPO's smooth regularizer beats DPPO-Binary-TV's mask",
             "DRPO (arXiv 2606.09821)", ("drpo", "mb1-fp32-k2"), ("dppo_binary_tv", "mb1-fp32-k2")),
    Contrast("asynchronous rollouts two updates stale: CPPO's prefix budget on top-K TV beats DPPO-Binary-TV",
             "CPPO (arXiv 2606.10968)", ("cppo", "mb1-fp32-k2"), ("dppo_binary_tv", "mb1-fp32-k2")),
    Contrast("asynchronous rollouts two updates stale: M2PO's second-moment mask beats DPPO-Binary-TV",
             "M2PO (arXiv 2510.01161)", ("m2po", "mb1-fp32-k2"), ("dppo_binary_tv", "mb1-fp32-k2")),
    # Added before the runs of the ``steps`` and ``steps_size`` experiments (eight seeds: the first three claims are
    # primary, Holm-corrected together).
    Contrast("four full-batch gradient steps per rollout (stale after the first, no small minibatches): "
             "DPPO-Binary-TV beats PG-IS", "fig:sanity_test", ("dppo_binary_tv", "steps-ep4"), ("pg_is", "steps-ep4"),
             family="primary", experiment="steps"),
    Contrast("four minibatch steps per rollout (the later sittings' policy): DPPO-Binary-TV beats PG-IS",
             "fig:sanity_test", ("dppo_binary_tv", "steps-mb4"), ("pg_is", "steps-mb4"), family="primary",
             experiment="steps"),
    Contrast("without a trust region, one on-policy step at four times the lr beats four stale minibatch steps at "
             "the lr (staleness, not the size of the update per rollout, is what hurts)", "staleness apart from "
             "step count", ("pg_is", "steps-lr2e-3"), ("pg_is", "steps-mb4"), family="primary", experiment="steps"),
    Contrast("without a trust region, four full-batch steps per rollout beat four quarter-batch steps",
             "staleness apart from step count", ("pg_is", "steps-ep4"), ("pg_is", "steps-mb4")),
    Contrast("PG-IS: one step per rollout at four times the lr beats one at the lr", "staleness apart from step count",
             ("pg_is", "steps-lr2e-3"), ("pg_is", "steps-mb1")),
    Contrast("DPPO-Binary-TV: four minibatch steps per rollout beat one on-policy step (PG-IS, which DPPO equals "
             "there)", "fig:sanity_test", ("dppo_binary_tv", "steps-mb4"), ("pg_is", "steps-mb1")),
    # Added before the runs of the ``regime`` experiment (eight seeds; the two twin contrasts are primary, Holm-
    # corrected together): Takeaway 2 where μ, π_θ' and π_θ all differ (int4 copy, four quarter-batch steps).
    *REGIME_CONTRASTS,
    # Added before the runs of the ``mechanism``, ``mechanism_noise`` and ``mechanism_grid`` experiments (eight
    # seeds; the seven primary claims are Holm-corrected together as the experiment ``mechanism``).
    *MECHANISM_CONTRASTS,
    # Added before the runs of the ``frontier`` experiment's new arms (eight seeds; the four claims against
    # DPPO-Binary-KL are primary, Holm-corrected together as the experiment ``frontier``).
    *FRONTIER_CONTRASTS,
    # Added before the runs of the ``frontier_more`` experiment (eight seeds; its four claims against DPPO-Binary-KL
    # are primary, Holm-corrected together as the experiment ``frontier_more``).
    *FRONTIER_MORE_CONTRASTS,
    # Added before the runs of the ``frontier_stale`` experiment (eight seeds; its eight claims against
    # DPPO-Binary-KL are primary, Holm-corrected together as the experiment ``frontier_stale``).
    *FRONTIER_STALE_CONTRASTS,
)
"""The study's claims, fixed before its runs: exploratory, or primary (Holm-corrected with the other primary claims
of their experiment, and scored as exploratory with fewer than :data:`PRIMARY_MIN_PAIRS` paired seeds). ``auc``:
mean training success over all steps. Each is scored by :func:`contrast_table`: it holds when the one-sided t-test
of ``left − right > margin`` rejects at 0.025 (for one claim alone: the paired 95% t-interval lies above the margin),
is refuted when that of ``left − right < −margin`` does, and the arms are equivalent when the two one-sided tests of
``|left − right| < margin`` do; else inconclusive."""


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
    and its verdict."""
    table = pd.DataFrame([{**score_contrast(outcomes, c), "task": c.task} for c in contrasts])
    table["same_as"] = same_runs_as(table)
    table = adjusted_for_family(table)
    table["verdict"] = table.apply(contrast_verdict, axis=1)
    return table


def summary_lines(table: pd.DataFrame) -> list[str]:
    """The contrast table as Markdown bullets, one per distinct comparison (a claim scored on the same numbers as
    an earlier one is named on that one's line): the summary in docs/cpu-study.md and the notebook's last cell print
    these same lines."""
    also = {}
    for row in table.itertuples():
        if row.same_as:
            also.setdefault(row.same_as, []).append(f"{row.claim} ({row.source})")
    lines = []
    for row in table.itertuples():
        if not row.same_as:
            lines.append(_summary_line(row, also.get(row.claim, [])))
    return lines


def _summary_line(row, duplicates: list[str]) -> str:
    head = f"- {row.claim} ({row.source}; {row.family})" + "".join(f"; same runs: {d}" for d in duplicates)
    if row.verdict == "not run":
        return f"{head}: not run yet"
    if row.verdict == "identical runs":
        return (f"{head}: **identical runs** — both arms gave {row.metric} {row.left:.3g} on each of {row.pairs} "
                f"seeds; no verdict")
    correction = (f", Holm-adjusted over {row.holm_size} distinct primary comparison{'s' * (row.holm_size != 1)}"
                  if row.family == "primary" else "")
    right = f"{row.right_metric} {row.right:.3g}" if row.right_metric else f"{row.right:.3g}"
    return (f"{head}: **{row.verdict}** — {row.metric} {row.left:.3g} vs {right}, difference "
            f"{row.difference:+.3g}, 95% t-interval [{row.ci_low:+.3g}, {row.ci_high:+.3g}], {row.pairs} paired "
            f"seeds, margin {row.margin:g}; one-sided p{correction}: claim {row.p_above_adjusted:.2g}, reverse "
            f"{row.p_below_adjusted:.2g}, equivalence {row.p_equivalent_adjusted:.2g}")


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
    labels = [f"{low + 1}-{high}" for low, high in zip(STRETCHES[:-1], STRETCHES[1:])]
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


def held_out_table(outcomes: pd.DataFrame, conditions: tuple[str, ...]) -> pd.DataFrame:
    """Per arm of ``conditions``: runs, AUC, held-out success of the rollout copy and of the fp32 learner at the
    start and the end (means over seeds), the seeds whose copy ended below its start, and collapses."""
    rows = outcomes[outcomes["condition"].isin(conditions)]
    return rows.assign(fell=rows["eval_after"] < rows["eval_before"]).groupby(["condition", "arm_method"]).agg(
        runs=("seed", "count"), auc=("auc", "mean"), copy_start=("eval_before", "mean"),
        copy_end=("eval_after", "mean"), learner_start=("eval_learner_before", "mean"),
        learner_end=("eval_learner_after", "mean"), ended_lower=("fell", "sum"), collapsed=("collapsed", "sum"))


def claim_result(table: pd.DataFrame, contrast: Contrast) -> str:
    """One claim's verdict as the scale section prints it: ``**verdict**`` with its paired difference, 95%
    t-interval and pairs, or ``not run``."""
    row = table.set_index("claim").loc[contrast.claim]
    if row["verdict"] in ("not run", "identical runs"):
        return f"**{row['verdict']}**"
    return (f"**{row['verdict']}** ({row['difference']:+.3f}, [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], "
            f"{row['pairs']} pairs)")


SCALE_MARKER = "<!-- cpu-study:scale -->"
"""The page's opening section, what this scale can and cannot say, sits between two of these lines."""
SCALE_CANNOT = (
    "- **What it cannot say.** Whether the paper's regime holds at scale: a mismatch that accumulates over long "
    "training at a small learning rate (no precision mismatch grew here in 50 steps), a real inference engine's "
    "kernels (the int4 copy is simulated quantisation of the learner), top-K at a real vocabulary, or "
    "generalisation beyond one task's held-out puzzles. Each claim below is about this policy, this task and these "
    "settings."
)


def scale_lines(table: pd.DataFrame) -> list[str]:
    """The page's opening section (between :data:`SCALE_MARKER` lines), from the scored claims: what a tiny policy
    on two cores can and cannot say, the result of Takeaway 2 in its regime, the mechanism's claims and the later
    rules' (:func:`frontier_line`)."""
    regime, mechanism = REGIME_CONTRASTS, MECHANISM_CONTRASTS
    return [
        "- **What it can say.** How each rule acts when μ and π_θ differ by a known, injected amount, on a tiny "
        "Sudoku policy, paired by seed (eight seeds for every primary claim), with every claim written before its "
        "runs.",
        SCALE_CANNOT,
        f"- **Takeaway 2 in its regime** (int4 copy, four quarter-batch steps per rollout: μ, π_θ' and π_θ all "
        f"differ). DPPO-Binary-KL anchored on μ against the same mask on the recomputed π_θ': "
        f"{claim_result(table, regime[0])}; DPPO-Binary-TV likewise: {claim_result(table, regime[1])}.",
        f"- **The int4 result's mechanism** (one step per rollout). In PG-IS runs, Â < 0 is more common among the "
        f"tokens over δ where μ > π than where μ < π: {claim_result(table, mechanism[0])}. PG-IS against the whole "
        f"μ-anchored mask: {claim_result(table, mechanism[1])}; against its A<0 half alone: "
        f"{claim_result(table, mechanism[2])}; against its A>0 half alone: {claim_result(table, mechanism[3])}. "
        f"The fp32 learner's own held-out loss under the mask: {claim_result(table, mechanism[6])}. A redrawn grid: "
        f"{claim_result(table, mechanism[4])}; matched noise: {claim_result(table, mechanism[5])}.",
        frontier_line(table, FRONTIER_ARMS, FRONTIER_CONTRASTS),
        frontier_line(table, FRONTIER_MORE_ARMS, FRONTIER_MORE_CONTRASTS),
        frontier_line(table, FRONTIER_STALE_ARMS, FRONTIER_STALE_CONTRASTS, FRONTIER_STALE_HEADING),
    ]


FRONTIER_INT4_HEADING = ("The field after DPPO under the int4 copy", "one step per rollout; the `mechanism` "
                         "experiment's DPPO-Binary-KL and PG-IS runs as references")
"""The ``frontier`` and ``frontier_more`` lines' heading: the setting, in bold, and after the experiment's name how
it was played."""
FRONTIER_STALE_HEADING = ("The field after DPPO under staleness", "four quarter-batch steps per rollout, an fp32 "
                          "copy; DPPO-Binary-KL and PG-IS played beside them")
"""The ``frontier_stale`` line's heading."""


def frontier_line(table: pd.DataFrame, arms: tuple[tuple[str, str], ...], contrasts: tuple[Contrast, ...],
                  heading: tuple[str, str] = FRONTIER_INT4_HEADING) -> str:
    """The scale section's line on a field experiment: each of its later rules (``arms``) against DPPO-Binary-KL
    (primary) and against PG-IS (exploratory), as scored (``contrasts``, in that order)."""
    against_dppo, against_pg_is = contrasts[:len(arms)], contrasts[len(arms):]
    setting, played = heading
    return (f"- **{setting}** (`{contrasts[0].experiment}`, {played}). Against DPPO-Binary-KL: "
            + "; ".join(f"{label} {claim_result(table, contrast)}"
                        for (_, label), contrast in zip(arms, against_dppo))
            + ". Against PG-IS: "
            + "; ".join(f"{label} {claim_result(table, contrast)}"
                        for (_, label), contrast in zip(arms, against_pg_is)) + ".")


def scale_block(text: str) -> list[str]:
    """The lines between the two :data:`SCALE_MARKER` lines of ``text``."""
    parts = text.split(SCALE_MARKER + "\n")
    if len(parts) != 3:
        raise ValueError(f"expected exactly two {SCALE_MARKER!r} lines, found {len(parts) - 1}")
    return parts[1].splitlines()


def replace_scale(text: str, lines: list[str]) -> str:
    """``text`` with its scale section replaced by ``lines``."""
    before, _, after = text.split(SCALE_MARKER + "\n")
    return before + SCALE_MARKER + "\n" + "".join(line + "\n" for line in lines) + SCALE_MARKER + "\n" + after


SUMMARY_MARKER = "<!-- cpu-study:summary -->"
"""The summary of the study in docs/cpu-study.md sits between two of these lines."""


def readme_summary(study_dir: PathLike) -> list[str]:
    """The summary lines of the study in ``study_dir``, scored as the report notebook scores them."""
    return readme_blocks(study_dir)[0]


def readme_blocks(study_dir: PathLike) -> tuple[list[str], list[str]]:
    """The page's two generated blocks for the study in ``study_dir``, scored once: the summary lines and the
    scale section's lines."""
    table = contrast_table(run_outcomes(load_study(study_dir), THRESHOLD))
    return summary_lines(table), scale_lines(table)


def rewrite_page(text: str, study_dir: PathLike) -> str:
    """``text`` (docs/cpu-study.md) with its summary and, where it has one, its scale section written from the
    study in ``study_dir``."""
    summary, scale = readme_blocks(study_dir)
    text = replace_summary(text, summary)
    return replace_scale(text, scale) if SCALE_MARKER in text else text


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
