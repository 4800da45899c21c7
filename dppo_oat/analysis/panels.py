"""The standard panels of a learning-curve figure: which metrics each one draws, and how.

A panel draws one or more metrics (its *series*) for every method; series are told apart by line style, methods
by colour. Fractions are drawn in % where the paper does. Any metric name of a run can also be asked for directly
and gets a panel of its own (:func:`resolve_panels`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from dppo_oat.trust_region import MU_BUCKETS


@dataclass(frozen=True)
class Series:
    """One metric of a panel, with its name in the panel's line-style key (empty for a single-series panel)."""

    metric: str
    label: str = ""


@dataclass(frozen=True)
class Panel:
    """One axes of the figure: a title, the series it draws, its y label, and whether values are shown in %."""

    title: str
    series: tuple[Series, ...]
    ylabel: str = ""
    percent: bool = False
    description: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric names this panel draws."""
        return tuple(s.metric for s in self.series)


MU_BUCKET_LABELS = {"mu_lt_0.1": "μ < 0.1", "mu_0.1_0.5": "0.1 ≤ μ < 0.5", "mu_ge_0.5": "μ ≥ 0.5"}
"""Display names of the μ buckets of the shadow-mask metrics (:data:`dppo_oat.trust_region.MU_BUCKETS`)."""


def shadow_panel(preset: str, name: str) -> Panel:
    """What the ratio clipping of ``preset`` would have blocked on each run's own batches, by μ bucket."""
    series = tuple(
        Series(f"shadow/{preset}/mask_fraction_{bucket}", MU_BUCKET_LABELS[bucket]) for _, _, bucket in MU_BUCKETS
    )
    return Panel(
        f"{name} would clip, by μ", series, "% of tokens (A ≠ 0)", percent=True,
        description=f"share of the tokens in each μ bucket that {name}'s ratio clip would have blocked",
    )


PANELS: dict[str, Panel] = {
    "reward": Panel("Training reward", (Series("reward"),), "mean episode return",
                    description="mean return of the rollout episodes of each step"),
    "success": Panel("Training success", (Series("success"),), "% of episodes", percent=True,
                     description="share of rollout episodes that solved the task"),
    "eval": Panel("Eval success", (Series("eval/success"),), "% of episodes", percent=True,
                  description="success on the held-out evaluation episodes"),
    "eval_return": Panel("Eval return", (Series("eval/return"),), "mean episode return",
                         description="mean return on the evaluation episodes"),
    "mismatch": Panel("Mean |π − μ|", (Series("mismatch/abs_diff_mean"),), "training-inference mismatch",
                      description="mean |π_θ − μ| over response tokens (sec:stability)"),
    "engine_mismatch": Panel("First-minibatch |π − μ|", (Series("mismatch/first_abs_diff_mean"),),
                             "engine mismatch",
                             description="mean |π_θ − μ| on each step's first minibatch, before any update on it: "
                                         "the rollout engine's mismatch without staleness"),
    "entropy": Panel("Entropy", (Series("entropy"),), "nats per token",
                     description="the policy's mean token entropy"),
    "response_length": Panel("Response length", (Series("response_length"),), "tokens",
                             description="mean response length in tokens"),
    "mask_fraction": Panel(
        "Masked updates by sign of A",
        (Series("mask/fraction_pos_adv", "A > 0"), Series("mask/fraction_neg_adv", "A < 0")),
        "% of tokens", percent=True,
        description="share of tokens whose update the run's own trust region blocked, by sign of the advantage",
    ),
    "bad_update": Panel("Bad updates", (Series("bad_update/fraction"),), "% of tokens (A ≠ 0)", percent=True,
                        description="A < 0 and μ − π ≥ 0.5: the updates Takeaway 3 blames for collapse"),
    "shadow": shadow_panel("grpo_clip_higher", "GRPO-ClipHigher"),
    "shadow_ppo": shadow_panel("ppo", "PPO"),
    "is_truncated": Panel("IS truncation", (Series("is/truncated_fraction"),), "% of tokens", percent=True,
                          description="share of tokens whose importance weight π/μ exceeded the cap C"),
    "divergence": Panel("Divergence D_t", (Series("divergence/mean", "mean"), Series("divergence/max", "max")),
                        "D_t", description="the divergence the run's rule thresholds (|r − 1| for ratio rules)"),
    "grad_norm": Panel("Gradient norm", (Series("grad_norm"),), "‖g‖", description="gradient norm per step"),
}
"""The standard panels by name (the ``--metrics`` names of ``dppo-plot``)."""

DEFAULT_PANELS = (
    "reward", "success", "eval", "mismatch", "entropy", "response_length",
    "mask_fraction", "bad_update", "shadow", "is_truncated",
)
"""The panels of a figure when none are asked for: those of the paper's stability and efficiency figures."""


def metric_panel(metric: str) -> Panel:
    """An ad hoc panel for one raw metric name."""
    return Panel(metric, (Series(metric),))


def resolve_panels(names: Iterable[str | Panel]) -> list[tuple[str, Panel]]:
    """``(name, panel)`` for each item: a :class:`Panel` as is (named by its title), a standard panel's name, else
    a raw metric name, which gets a panel of its own."""
    resolved = []
    for item in names:
        if isinstance(item, Panel):
            resolved.append((item.title, item))
        else:
            resolved.append((item, PANELS.get(item) or metric_panel(item)))
    return resolved


def available_panels(df: pd.DataFrame, names: Iterable[str | Panel]) -> tuple[list[tuple[str, Panel]], list[str]]:
    """The panels among ``names`` that some run of ``df`` has data for, and a note for each one skipped (naming the
    runs whose values of it are all NaN or infinite, ``df.attrs["nonfinite"]`` of :func:`~.runs.load_runs`)."""
    logged, nonfinite = set(df["metric"].unique()), df.attrs.get("nonfinite", {})
    kept, skipped = [], []
    for name, panel in resolve_panels(names):
        never_finite = [metric for metric in panel.metrics if metric in nonfinite]
        if logged.intersection(panel.metrics):
            kept.append((name, panel))
        elif never_finite:
            metric = never_finite[0]
            skipped.append(f"{name} (every value of {metric} is NaN or infinite, in {', '.join(nonfinite[metric])})")
        elif panel.metrics == (name,) and name not in PANELS:
            skipped.append(f"{name} (neither a standard panel nor a metric any run logs)")
        else:
            skipped.append(f"{name} (no run logs {', '.join(panel.metrics)})")
    return kept, skipped
