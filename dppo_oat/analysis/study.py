"""Tables of a study: many methods × conditions × seeds, as ``scripts/cpu_study.py`` writes them.

A study directory holds one folder per task, each with one run directory per (method, mismatch, seed)::

    <study>/study.json                 the plan and each run's state
    <study>/<task>/<method>-<mismatch>-s<seed>/{config.json, metrics.jsonl, eval.jsonl}

:func:`load_study` reads it into the long table of :func:`~dppo_oat.analysis.runs.load_runs` with two more run
columns, ``task`` and ``mismatch``; the functions below reduce it to the numbers of the paper's stability and
efficiency claims (sec:stability, sec:training_efficiency): steps to a success threshold, final success, collapses,
the trend of |π − μ|, bad updates, and the binary vs top-K vs exact divergence probe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dppo_oat.analysis.curves import smooth
from dppo_oat.analysis.runs import PathLike, label_runs, load_runs

GROUP = ["task", "variant", "mismatch"]
"""One row of a study table: a method (the preset's paper name) under one mismatch condition on one task."""
COLLAPSE_RATIO = 0.5
COLLAPSE_MIN_DROP = 0.1
"""A run *collapses* when its final training success is below ``COLLAPSE_RATIO`` of its smoothed peak and at least
``COLLAPSE_MIN_DROP`` (absolute) under it: at a success of a few %, halving is within the noise of one rollout."""


def load_study(study_dir: PathLike) -> pd.DataFrame:
    """Every run of the study as one long table, with ``task`` (its folder) and ``mismatch`` (``bf16`` when the
    rollout ran in bfloat16 or log-probs were perturbed, else ``none``) columns; ``method`` is the variant."""
    run_dirs = sorted(Path(study_dir).glob("*/*/config.json"))
    if not run_dirs:
        raise FileNotFoundError(f"no study runs under {study_dir!r}: run scripts/cpu_study.py first")
    df = load_runs([str(path.parent) for path in run_dirs])
    configs = {str(path.parent): json.loads(path.read_text()) for path in run_dirs}
    df["task"] = df["path"].map(lambda p: Path(p).parent.name)
    df["mismatch"] = df["path"].map(lambda p: mismatch_of(configs[p]))
    return label_runs(df)


def mismatch_of(config: dict) -> str:
    """The injected training-inference mismatch of a run's config: ``bf16``, ``noise`` or ``none``."""
    if config.get("rollout_dtype", "float32") != "float32":
        return "bf16"
    return "noise" if config.get("logprob_noise", 0.0) else "none"


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
    """One row per run: its study columns, first step where smoothed ``metric`` ≥ ``threshold`` (NaN if never),
    initial/peak/final (mean of the last ``tail`` share) ``metric``, whether it collapsed, held-out success before and
    after, |π − μ| at the start and the end, and its mean bad-update, masked and IS-truncated fractions."""
    curve = per_run_curve(df, metric, sigma)
    runs = df.drop_duplicates("run").set_index("run")[["task", "variant", "algo", "mismatch", "seed"]]
    grouped = curve.groupby("run")
    runs["steps_to_threshold"] = grouped.apply(lambda r: _first_step_at(r, threshold))
    runs["initial"] = grouped["value"].apply(lambda v: _head(v, tail))
    runs["peak"] = grouped["smooth"].max()
    runs["final"] = grouped["value"].apply(lambda v: _tail(v, tail))
    runs["collapsed"] = (runs["final"] < COLLAPSE_RATIO * runs["peak"]) & (runs["peak"] - runs["final"] >= COLLAPSE_MIN_DROP)
    mismatch = per_run_curve(df, "mismatch/abs_diff_mean", 0).groupby("run")["value"]
    runs["mismatch_start"] = mismatch.apply(lambda v: _head(v, tail))
    runs["mismatch_end"] = mismatch.apply(lambda v: _tail(v, tail))
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
    """One row per (task, method, mismatch): seeds, median steps to threshold (and how many seeds reached it),
    final training success mean ± std, collapses, held-out success before → after, |π − μ| start → end, and the
    mean bad-update / masked / IS-truncated shares in %."""
    groups = outcomes.groupby(GROUP, sort=False)
    table = pd.DataFrame({
        "seeds": groups.size(),
        "reached": groups["steps_to_threshold"].apply(lambda s: int(s.notna().sum())),
        "steps to threshold": groups["steps_to_threshold"].median(),
        "final success": groups["final"].mean(),
        "± std": groups["final"].std(ddof=0),
        "collapses": groups["collapsed"].sum().astype(int),
        "eval before": groups["eval_before"].mean(),
        "eval after": groups["eval_after"].mean(),
        "|π−μ| start": groups["mismatch_start"].mean(),
        "|π−μ| end": groups["mismatch_end"].mean(),
        "bad updates %": 100 * groups["bad_update"].mean(),
        "masked %": 100 * groups["masked"].mean(),
        "IS truncated %": 100 * groups["is_truncated"].mean(),
    })
    return table


def probe_table(df: pd.DataFrame) -> pd.DataFrame:
    """Binary vs top-K vs exact divergence on the study's real batches (the ``probe/*`` metrics), per task and
    mismatch: mean D_TV and D_KL of each estimate, what share of the exact one each bound recovers, and the share of
    tokens each estimate puts above δ (means over the probes of every run)."""
    rows = df[df["metric"].str.startswith("probe/")]
    if rows.empty:
        return pd.DataFrame()
    means = rows.groupby(["task", "mismatch", "metric"])["value"].mean().unstack("metric")
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


def compare(outcomes: pd.DataFrame, column: str, left: list[str], right: list[str], task: str,
            mismatch: str) -> tuple[float, float]:
    """Mean ``column`` over the runs of presets ``left`` and of ``right`` on ``task`` under ``mismatch``."""
    rows = outcomes[(outcomes["task"] == task) & (outcomes["mismatch"] == mismatch)]
    return (float(rows[rows["algo"].isin(left)][column].mean()),
            float(rows[rows["algo"].isin(right)][column].mean()))


def mismatch_growth(outcomes: pd.DataFrame) -> pd.Series:
    """|π − μ| at the end over at the start, per run (how much the training-inference mismatch grew)."""
    return outcomes["mismatch_end"] / outcomes["mismatch_start"].replace(0, np.nan)


UNCONSTRAINED = ["pg_is", "cispo"]
DPPO = ["dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv"]


def paper_claims(outcomes: pd.DataFrame, df: pd.DataFrame, mismatch: str = "bf16") -> pd.DataFrame:
    """The paper's stability and efficiency claims, each checked on the study's runs of every task under
    ``mismatch``: one row per (claim, task) with ``holds`` (True/False, None when the runs needed are missing) and
    the numbers behind it."""
    rows = []
    for task in outcomes["task"].unique():
        for claim, check in CLAIMS.items():
            holds, evidence = check(outcomes, df, task, mismatch)
            rows.append({"claim": claim, "task": task, "mismatch": mismatch, "holds": holds, "evidence": evidence})
    return pd.DataFrame(rows)


def _verdict(left: float, right: float, holds_if_left_greater: bool) -> bool | None:
    if np.isnan(left) or np.isnan(right):
        return None
    return bool(left > right) if holds_if_left_greater else bool(left < right)


def _claim_mismatch_grows(outcomes, df, task, mismatch):
    """Takeaway 1: without a trust region the training-inference mismatch accumulates; DPPO keeps it low."""
    rows = outcomes.assign(growth=mismatch_growth(outcomes))
    left, right = compare(rows, "growth", UNCONSTRAINED, DPPO, task, mismatch)
    return _verdict(left, right, True), f"|π−μ| end/start: PG-IS & CISPO {left:.2f}× vs DPPO {right:.2f}×"


def _claim_collapse(outcomes, df, task, mismatch):
    """Takeaway 1: PG-IS and CISPO collapse, DPPO does not."""
    rows = outcomes[(outcomes["task"] == task) & (outcomes["mismatch"] == mismatch)]
    unconstrained, dppo = rows[rows["algo"].isin(UNCONSTRAINED)], rows[rows["algo"].isin(DPPO)]
    if unconstrained.empty or dppo.empty:
        return None, "runs missing"
    holds = bool(unconstrained["collapsed"].sum() > 0 and dppo["collapsed"].sum() == 0)
    return holds, (f"collapses: PG-IS & CISPO {int(unconstrained['collapsed'].sum())}/{len(unconstrained)}, "
                   f"DPPO {int(dppo['collapsed'].sum())}/{len(dppo)}")


def _claim_final_success(outcomes, df, task, mismatch):
    """fig:sanity_test: DPPO ends with higher training success than PG-IS and CISPO."""
    left, right = compare(outcomes, "final", DPPO, UNCONSTRAINED, task, mismatch)
    return _verdict(left, right, True), f"final training success: DPPO {left:.3f} vs PG-IS & CISPO {right:.3f}"


def _claim_recompute_anchor(outcomes, df, task, mismatch):
    """Takeaway 2: MiniRL (anchored on the recomputed π_θ') controls the mismatch worse than DPPO (anchored on μ)."""
    left, right = compare(outcomes, "mismatch_end", ["minirl"], DPPO, task, mismatch)
    return _verdict(left, right, True), f"|π−μ| at the end: MiniRL {left:.4f} vs DPPO {right:.4f}"


def _claim_efficiency(outcomes, df, task, mismatch):
    """sec:training_efficiency: DPPO learns faster than ratio clipping (GRPO-ClipHigher)."""
    left, right = compare(outcomes, "final", DPPO, ["grpo_clip_higher"], task, mismatch)
    return _verdict(left, right, True), f"final training success: DPPO {left:.3f} vs GRPO-ClipHigher {right:.3f}"


def _claim_negative_updates(outcomes, df, task, mismatch):
    """Takeaway 3: the instability comes from negative samples; masking only them (mask_negative) is as stable as
    DPPO, and the unconstrained methods make more bad updates (A < 0, μ − π ≥ 0.5)."""
    left, right = compare(outcomes, "bad_update", UNCONSTRAINED, DPPO + ["mask_negative"], task, mismatch)
    return _verdict(left, right, True), (f"bad updates: PG-IS & CISPO {100 * left:.3f}% vs DPPO & mask-negative "
                                         f"{100 * right:.3f}%")


def _claim_low_probability_clipping(outcomes, df, task, mismatch):
    """sec:training_efficiency: ratio clipping falls mostly on low-probability tokens (μ < 0.1)."""
    runs = outcomes[(outcomes["task"] == task) & (outcomes["mismatch"] == mismatch)]["run"]
    rows = df[df["run"].isin(runs)]
    low = rows[rows["metric"] == "shadow/ppo/mask_fraction_mu_lt_0.1"]["value"].mean()
    high = rows[rows["metric"] == "shadow/ppo/mask_fraction_mu_ge_0.5"]["value"].mean()
    return _verdict(low, high, True), f"PPO would clip {100 * low:.2f}% of μ < 0.1 tokens vs {100 * high:.2f}% of μ ≥ 0.5"


def _claim_divergence_bounds(outcomes, df, task, mismatch):
    """app:divergence_lower_bounds: binary ≤ top-K ≤ exact, the top-K estimate the closer to the exact one."""
    runs = outcomes[(outcomes["task"] == task) & (outcomes["mismatch"] == mismatch)]["run"]
    rows = df[df["run"].isin(runs)]
    means = {e: rows[rows["metric"] == f"probe/{e}_tv_mean"]["value"].mean() for e in ("binary", "topk", "exact")}
    if any(np.isnan(v) for v in means.values()):
        return None, "no probe/* metrics (--probe-every)"
    holds = bool(means["binary"] <= means["topk"] <= means["exact"])
    return holds, "mean D_TV: binary {binary:.4f} ≤ top-K {topk:.4f} ≤ exact {exact:.4f}".format(**means)


CLAIMS = {
    "no trust region → mismatch grows (Takeaway 1)": _claim_mismatch_grows,
    "no trust region → collapse, DPPO stable (Takeaway 1)": _claim_collapse,
    "DPPO ends higher than PG-IS/CISPO (fig:sanity_test)": _claim_final_success,
    "recompute anchor (MiniRL) → more mismatch (Takeaway 2)": _claim_recompute_anchor,
    "DPPO beats ratio clipping (sec:training_efficiency)": _claim_efficiency,
    "bad updates come without a trust region (Takeaway 3)": _claim_negative_updates,
    "ratio clipping hits low-probability tokens": _claim_low_probability_clipping,
    "binary ≤ top-K ≤ exact divergence": _claim_divergence_bounds,
}
"""Each claim: ``check(outcomes, df, task, mismatch) -> (holds, evidence)``."""


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
    """The claim ``left − right > margin`` on ``metric``, paired by seed; arms are ``(method, condition)``."""

    claim: str
    source: str
    left: tuple[str, str]
    right: tuple[str, str]
    metric: str = "auc"
    margin: float = AUC_MARGIN


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
)
"""The study's claims, fixed before its runs. ``auc``: mean training success over all steps; the claim holds when
the paired 95% CI of ``left − right`` lies above ``margin``, is refuted below ``−margin``, else is inconclusive."""
