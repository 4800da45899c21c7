"""The clipped-token analysis (app:clipped_tokens, sec:training_efficiency): which tokens ratio clipping blocks.

Two sources, the second optional:

- the *shadow-mask* metrics every run logs: what ``ppo`` and ``grpo_clip_higher`` would have clipped on the run's
  own batches, by μ bucket (:func:`shadow_summary`);
- a run's ``tokens.jsonl``, a stratified sample of every step's response tokens (:mod:`dppo_oat.run.token_samples`,
  the local and oat engines write it): the decoded token, μ, π, advantage, entropy, the run's own decision (``masked``)
  and the reference rules' (``ppo_masked``, ``grpo_clip_higher_masked``, ``dppo_masked``), and a ``weight`` (tokens its
  stratum stands for). Shares are weighted, so they estimate shares over all tokens although blocked tokens are
  over-sampled (:func:`load_tokens`): which tokens were blocked by μ bucket and entropy, the most frequently clipped
  ones in positive and negative samples, and where ratio clipping and DPPO disagree (:func:`disagreements`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dppo_oat.analysis.panels import MU_BUCKET_LABELS, Panel, Series
from dppo_oat.analysis.runs import RUN_COLUMNS, PathLike, read_table
from dppo_oat.run.directory import RunDir
from dppo_oat.trust_region import MU_BUCKETS

TOKEN_FIELDS = ("step", "token", "turn", "mu", "pi", "advantage", "entropy", "divergence", "weight", "masked",
                "ppo_masked", "grpo_clip_higher_masked", "dppo_masked")
MASKS = {"ppo_masked": "ratio clip (PPO)", "dppo_masked": "DPPO"}
"""The two decisions the analysis compares (``tokens.jsonl`` columns) and their display names."""
BOOL_FIELDS = ("masked", "ppo_masked", "grpo_clip_higher_masked", "dppo_masked")
DISAGREEMENTS = {"clip_only": "blocked by ratio clipping only", "dppo_only": "blocked by DPPO only"}
"""The tokens one rule blocks and the other lets through (:func:`disagreements`)."""
SHADOW_PRESETS = {"ppo": "PPO", "grpo_clip_higher": "GRPO-ClipHigher"}


def read_tokens(run_dir: PathLike) -> pd.DataFrame | None:
    """A run's ``tokens.jsonl`` (masks as bools, numbers as floats), or None when the run has none."""
    path = RunDir(run_dir).tokens
    if not path.is_file():
        return None
    tokens = read_table(path)
    for column in ("turn", "mu", "pi", "advantage", "entropy", "divergence", "weight"):
        tokens[column] = pd.to_numeric(tokens.get(column, pd.Series(np.nan, index=tokens.index)), errors="coerce")
    tokens["weight"] = tokens["weight"].fillna(1.0)  # a uniform sample (or rows written by hand): weight 1
    for column in BOOL_FIELDS:  # true, 1 or "true" is blocked; false, 0, null or a missing field is not
        tokens[column] = tokens.get(column, pd.Series(False, index=tokens.index)).isin([True, "true", "True"])
    token = tokens["token"].astype(object) if "token" in tokens else pd.Series("", index=tokens.index)
    tokens["token"] = token.where(token.notna(), "").astype(str)
    return tokens[list(TOKEN_FIELDS)]


def load_tokens(df: pd.DataFrame) -> pd.DataFrame:
    """The ``tokens.jsonl`` of every run of the long table ``df`` that has one, with the run columns.

    Empty (with the columns) when no run has one; ``mu_bucket`` and ``sample`` (positive/negative/zero advantage)
    are added.
    """
    runs = df.drop_duplicates("run")[list(RUN_COLUMNS)]
    tables = []
    for run in runs.itertuples(index=False):
        tokens = read_tokens(run.path)
        if tokens is not None and len(tokens):
            tables.append(tokens.assign(**{column: getattr(run, column) for column in RUN_COLUMNS}))
    if not tables:
        tables = [_empty_tokens().assign(**{column: pd.Series(dtype=object) for column in RUN_COLUMNS})]
    tokens = pd.concat(tables, ignore_index=True)
    return tokens.assign(mu_bucket=mu_bucket(tokens["mu"]), sample=sample_sign(tokens["advantage"]))


def _empty_tokens() -> pd.DataFrame:
    """A token table without rows, with the column types of :func:`read_tokens`."""
    types = {"step": "int64", "token": object, **{name: float for name in TOKEN_FIELDS[2:9]},
             **{name: bool for name in BOOL_FIELDS}}
    return pd.DataFrame({column: pd.Series(dtype=dtype) for column, dtype in types.items()})


def mu_bucket(mu: pd.Series) -> pd.Series:
    """The μ bucket of each token (the buckets of the shadow-mask metrics), as an ordered categorical."""
    edges = [low for low, _, _ in MU_BUCKETS] + [np.inf]
    labels = [MU_BUCKET_LABELS[name] for _, _, name in MU_BUCKETS]
    return pd.cut(mu, bins=edges, labels=labels, right=False)


def sample_sign(advantage: pd.Series) -> pd.Series:
    """``positive``, ``negative`` or ``zero``: the sign of each token's advantage."""
    return pd.Series(np.select([advantage > 0, advantage < 0], ["positive", "negative"], "zero"), index=advantage.index)


def weighted_percent(tokens: pd.DataFrame, keys: list, columns: dict[str, pd.Series]) -> pd.DataFrame:
    """Per group of ``keys``: the sampled tokens and, for each boolean column, the weighted % of tokens where it is
    true (the sample's weights make it an estimate over all tokens)."""
    weight = tokens["weight"]
    frame = pd.DataFrame({name: values.astype(float) * weight for name, values in columns.items()})
    grouped = frame.assign(_weight=weight).groupby(keys, observed=True)
    table = grouped.sum()
    table = (100 * table[list(columns)].div(table["_weight"], axis=0)).round(2)
    table.insert(0, "tokens", grouped.size())
    return table


def masked_by_bucket(tokens: pd.DataFrame, by: str = "method") -> pd.DataFrame:
    """Per group and μ bucket: sampled tokens with A ≠ 0, and the % of such tokens blocked by ratio clipping and by
    DPPO (weighted: an estimate over all tokens)."""
    active = tokens[tokens["sample"] != "zero"]
    groups = pd.Categorical(active[by], categories=list(dict.fromkeys(active[by])))
    table = weighted_percent(active, [groups, active["mu_bucket"]], {f"{v} %": active[k] for k, v in MASKS.items()})
    table = table.reset_index()
    return table.rename(columns={table.columns[0]: by}).astype({by: "object", "mu_bucket": "object"})


def disagreements(tokens: pd.DataFrame) -> pd.DataFrame:
    """Where ratio clipping (PPO's, ε = 0.2) and DPPO-Binary-TV (δ = 0.15) disagree, by μ bucket and sign of the
    advantage: the weighted % of tokens (A ≠ 0) that only ratio clipping blocks, and that only DPPO blocks
    (sec:method_limitations: the first are low-probability tokens whose ratio moved while π barely did)."""
    active = tokens[tokens["sample"] != "zero"]
    flags = {f"{name} %": flag for name, flag in disagreement_flags(active).items()}
    return weighted_percent(active, [active["sample"], active["mu_bucket"]], flags).reset_index().astype(
        {"sample": "object", "mu_bucket": "object"})


def disagreement_flags(tokens: pd.DataFrame) -> dict[str, pd.Series]:
    """Per token: blocked by ratio clipping and not by DPPO, and the reverse (see :data:`DISAGREEMENTS`)."""
    return {"clip_only": tokens["ppo_masked"] & ~tokens["dppo_masked"],
            "dppo_only": tokens["dppo_masked"] & ~tokens["ppo_masked"]}


def top_disagreement_tokens(tokens: pd.DataFrame, which: str = "clip_only", n: int = 30) -> pd.DataFrame:
    """The tokens most often in ``which`` (``clip_only`` or ``dppo_only``), decoded, with their mean μ and π, side
    by side for positive and negative samples (as :func:`top_clipped_side_by_side`)."""
    flagged = tokens.assign(_flag=disagreement_flags(tokens)[which])
    return top_clipped_side_by_side(flagged, "_flag", n)


def top_clipped_tokens(tokens: pd.DataFrame, sample: str, mask: str = "ppo_masked", n: int = 50) -> pd.DataFrame:
    """The ``n`` tokens most often blocked by ``mask`` in ``sample`` (``positive`` or ``negative``) samples.

    Columns: ``token`` (its ``repr``, so that spaces and newlines show, as in the paper's lists), ``count``
    (how often it was blocked) and ``blocked %`` (of that token's occurrences in such samples).
    """
    rows = tokens[tokens["sample"] == sample]
    weighted = rows.assign(_blocked=rows[mask].astype(float) * rows["weight"])
    counts = weighted.groupby("token", sort=False).agg(
        sum=(mask, "sum"), size=(mask, "size"), blocked=("_blocked", "sum"), weight=("weight", "sum"))
    counts = counts[counts["sum"] > 0].sort_values(["sum", "size"], ascending=[False, True], kind="stable").head(n)
    return pd.DataFrame({
        "token": [repr(token) for token in counts.index],
        "count": counts["sum"].astype(int).to_numpy(),
        "blocked %": (100 * counts["blocked"] / counts["weight"]).round(1).to_numpy(),
    })


def top_clipped_side_by_side(tokens: pd.DataFrame, mask: str = "ppo_masked", n: int = 50) -> pd.DataFrame:
    """:func:`top_clipped_tokens` of positive and of negative samples side by side (blank where one list is
    shorter), under the column groups ``positive samples`` and ``negative samples``."""
    tables = {sample: top_clipped_tokens(tokens, sample, mask, n).astype(object) for sample in ("positive", "negative")}
    rows = range(max(len(table) for table in tables.values()))
    return pd.concat({f"{s} samples": table.reindex(rows, fill_value="") for s, table in tables.items()}, axis=1)


def token_step_metrics(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per run and step, the mean μ and entropy of the tokens each mask blocked (and the entropy of all tokens):
    the paper's "rollout probability / entropy of clipped tokens" curves (fig:low_prob_sweep), as long rows."""
    rows = []
    for mask in MASKS:
        blocked = tokens.loc[tokens[mask].astype(bool)]
        for field in ("mu", "entropy"):
            rows.append(_step_means(blocked, field, f"tokens/{mask}/{field}"))
    rows.append(_step_means(tokens, "entropy", "tokens/all/entropy"))
    return pd.concat(rows, ignore_index=True)


def _step_means(tokens: pd.DataFrame, field: str, metric: str) -> pd.DataFrame:
    """Long rows of ``metric``: the weighted mean of ``field`` over each run's tokens at each step (tokens without
    a value left out), with the run columns."""
    known = tokens[tokens[field].notna()]
    sums = known.assign(_x=known[field] * known["weight"]).groupby(["run", "step"], sort=False)[["_x", "weight"]].sum()
    means = (sums["_x"] / sums["weight"]).rename("value").reset_index()
    runs = tokens.drop_duplicates("run")[[c for c in RUN_COLUMNS if c != "run"] + ["run"]]
    return means.merge(runs, on="run").assign(metric=metric)


TOKEN_PANELS = (
    Panel("μ of blocked tokens", tuple(Series(f"tokens/{m}/mu", name) for m, name in MASKS.items()),
          "mean μ(a_t)", description="mean rollout probability of the tokens each mask blocked"),
    Panel("Entropy of blocked tokens",
          (*(Series(f"tokens/{m}/entropy", name) for m, name in MASKS.items()), Series("tokens/all/entropy", "all")),
          "nats", description="mean entropy at the tokens each mask blocked, and over all tokens"),
)
"""Panels for :func:`token_step_metrics` rows (pass them to ``plot_runs(..., metrics=TOKEN_PANELS)``)."""


def shadow_summary(df: pd.DataFrame, by: str = "method") -> pd.DataFrame:
    """Mean over steps (then over a group's runs) of the shadow-mask fractions by μ bucket, and of the run's own
    mask fraction, in %: one row per group, one column per (clip rule, μ bucket), plus ``own mask``."""
    columns = {f"shadow/{p}/mask_fraction_{b}": f"{name} · {MU_BUCKET_LABELS[b]}"
               for p, name in SHADOW_PRESETS.items() for _, _, b in MU_BUCKETS}
    columns["mask/fraction"] = "own mask"
    rows = df[df["metric"].isin(columns)]
    per_run = rows.groupby([by, "run", "metric"], sort=False)["value"].mean()
    table = 100 * per_run.groupby(level=[by, "metric"], sort=False).mean().unstack("metric")
    present = [metric for metric in columns if metric in table.columns]
    return table[present].rename(columns=columns).rename_axis(columns=None)


def shadow_notes(summary: pd.DataFrame) -> list[str]:
    """One sentence per row of :func:`shadow_summary` and clip rule: the μ bucket where that ratio clip would block
    the largest share of tokens in these runs, against its share at the highest bucket (the paper finds μ < 0.1)."""
    buckets = [MU_BUCKET_LABELS[b] for _, _, b in MU_BUCKETS]
    notes = []
    for group, row in summary.iterrows():
        for name in SHADOW_PRESETS.values():
            shares = pd.Series({bucket: row.get(f"{name} · {bucket}") for bucket in buckets}, dtype=float).dropna()
            if shares.empty:
                continue
            notes.append(f"{group}: {name}'s ratio clip would block most at {shares.idxmax()} ({shares.max():.2f} % "
                         f"of tokens; {shares.iloc[-1]:.2f} % at {shares.index[-1]})")
    return notes


def load_token_exports(df: pd.DataFrame) -> pd.DataFrame:
    """Every token of every step the runs of ``df`` exported (``--token-export all``,
    :func:`dppo_oat.run.token_export.read_token_export`), trained tokens only, with the run columns, ``mu``/``pi``
    (probabilities), ``mu_bucket`` and ``sample``; runs without exports are left out (the table's ``run`` column
    says which runs it holds), and it is empty when no run exported any."""
    from dppo_oat.run.token_export import read_token_export

    tables = []
    for run in df.drop_duplicates("run")[list(RUN_COLUMNS)].itertuples(index=False):
        if RunDir(run.path).exported_steps():
            exported = read_token_export(run.path)
            tables.append(exported.assign(**{column: getattr(run, column) for column in RUN_COLUMNS}))
    if not tables:
        return pd.DataFrame()
    tokens = pd.concat(tables, ignore_index=True)
    tokens = tokens[tokens["loss_mask"]].reset_index(drop=True)
    tokens = tokens.assign(mu=np.exp(tokens["inference_logprobs"]), pi=np.exp(tokens["trainer_logprobs"]))
    return tokens.assign(mu_bucket=mu_bucket(tokens["mu"]), sample=sample_sign(tokens["advantages"]))


def exported_masked_by_bucket(tokens: pd.DataFrame, by: str = "method") -> pd.DataFrame:
    """Per group and μ bucket, over every exported token with A ≠ 0 (exact, no sample): the tokens and the % the
    run's own rule blocked, in all, with A > 0 (``high``) and with A < 0 (``low``)."""
    active = tokens[tokens["sample"] != "zero"].assign(weight=1.0)
    groups = pd.Categorical(active[by], categories=list(dict.fromkeys(active[by])))
    columns = {"blocked %": active["is_masked"], "blocked high %": active["is_masked_high"],
               "blocked low %": active["is_masked_low"]}
    table = weighted_percent(active, [groups, active["mu_bucket"]], columns).reset_index()
    return table.rename(columns={table.columns[0]: by}).astype({by: "object", "mu_bucket": "object"})
