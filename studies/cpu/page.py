"""The generated blocks of the CPU study's page (docs/cpu-study.md), written from the scored claims.

The page holds three blocks between marker lines: its opening section on what this scale can and cannot say
(:data:`SCALE_MARKER`, :func:`scale_lines`), the summary of every claim with its paired difference, 95%
t-interval and verdict (:data:`SUMMARY_MARKER`, :func:`summary_lines`), and the report's figures, the files the
report notebook writes into docs/figures/cpu-study/ (:data:`FIGURES_MARKER`, :func:`figure_lines`). The report
notebook prints the same lines, ``python -m studies.cpu.pack --readme docs/cpu-study.md`` rewrites the page's blocks
(:func:`rewrite_page`), and a test checks that the page's blocks are what the committed runs give
(:func:`readme_blocks`).

An arm that cannot be read as a trust region (it blocked almost nothing, most tokens, or collapsed within its first
steps: :func:`~studies.cpu.report.arm_flag_table`) gets no verdict in the opening section, only its flag; the
summary keeps every claim's verdict, as scored, and names the flag beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from dppo_oat.analysis.runs import PathLike
from studies.cpu.claims import (
    CONTRASTS,
    FRONTIER_ARMS,
    FRONTIER_CONTRASTS,
    FRONTIER_MORE_ARMS,
    FRONTIER_MORE_CONTRASTS,
    FRONTIER_STALE_ARMS,
    FRONTIER_STALE_CONTRASTS,
    HALVES_CONTRASTS,
    HELD_ARMS,
    HELD_CONTRASTS,
    HELD_STALE_CONTRASTS,
    MATCHED_ARMS,
    MATCHED_CONTRASTS,
    MATCHED_MORE_ARMS,
    MATCHED_MORE_CONTRASTS,
    MATCHED_STALE_CONTRASTS,
    MECHANISM_CONTRASTS,
    PLACEBO_CELLS_CONTRASTS,
    PLACEBO_CONTRASTS,
    REGIME_CONTRASTS,
    REGIME_LR_CONTRASTS,
    SIGN_CONTRASTS,
    SWEEP_CONTRASTS,
    SWEEP_RULES,
    SWEEP_TARGETS,
    THRESHOLD,
    Contrast,
    matched,
    swept,
)
from studies.cpu.figures import FIGURES, ROOT, STRENGTH_FILE, curves_file
from studies.cpu.report import (
    CALIBRATED_STEPS,
    HELD_STEPS,
    HELD_WITHIN,
    STRENGTH_CONDITION,
    blocked_by_half,
    blocked_per_run,
    blocked_ratio_range,
    blocked_share,
    contrast_table,
    held_out_table,
    held_strength,
    load_study,
    pooled_holm,
    run_outcomes,
    sign_shares_by_stretch,
    strength_table,
    sweep_arms,
)

DISPLAY_SOURCES = {
    "mechanism: int4's extra mass goes to wrong moves": "mechanism: over the run, Â < 0 is more common where int4 "
                                                         "over-weights a token (absent at the start)",
}
"""Display labels for claims whose pre-registered label (``Contrast.source``) says more than its design supports:
the claims file keeps every claim as it was written (claims are only ever added), and the page prints this label
instead. The sign claim pools all 50 steps; split by stretch, its difference is absent in steps 1–10 and builds up
after (:func:`~studies.cpu.report.sign_shares_by_stretch`), so it does not show that int4's extra mass goes to
wrong moves from the start."""


def shown_source(source: str) -> str:
    """A claim's label as the page prints it (:data:`DISPLAY_SOURCES`)."""
    return DISPLAY_SOURCES.get(source, source)


def summary_lines(table: pd.DataFrame) -> list[str]:
    """The contrast table as Markdown bullets, one per distinct comparison (a claim scored on the same numbers as
    an earlier one is named on that one's line), each with its verdict as scored and the flag of each flagged arm of
    its claims (:func:`flagged_arms`): the summary in docs/cpu-study.md and the notebook's last cell print these same
    lines."""
    also, flags = {}, {}
    for row in table.itertuples():
        origin = row.same_as or row.claim
        if row.same_as:
            also.setdefault(origin, []).append(f"{row.claim} ({shown_source(row.source)})")
        for arm in flagged_arms(row._asdict()):
            if arm not in flags.setdefault(origin, []):
                flags[origin].append(arm)
    return [_summary_line(row, also.get(row.claim, []), flags.get(row.claim, []))
            for row in table.itertuples() if not row.same_as]


def _summary_line(row, duplicates: list[str], flagged: list[tuple[str, str]]) -> str:
    head = f"- {row.claim} ({shown_source(row.source)}; {row.family})" + "".join(f"; same runs: {d}"
                                                                                 for d in duplicates)
    if row.verdict == "not run":
        return f"{head}: not run yet"
    flags = "".join(f"; flagged: {name}: {flag}" for name, flag in flagged)
    if row.verdict == "identical runs":
        return (f"{head}: **identical runs** — both arms gave {row.metric} {row.left:.3g} on each of {row.pairs} "
                f"seeds; no verdict{flags}")
    correction = (f", Holm-adjusted over {row.holm_size} distinct primary comparison{'s' * (row.holm_size != 1)}"
                  if row.family == "primary" else "")
    right = f"{row.right_metric} {row.right:.3g}" if row.right_metric else f"{row.right:.3g}"
    return (f"{head}: **{row.verdict}** — {row.metric} {row.left:.3g} vs {right}, difference "
            f"{row.difference:+.3g}, 95% t-interval [{row.ci_low:+.3g}, {row.ci_high:+.3g}], {row.pairs} paired "
            f"seeds, margin {row.margin:g}; one-sided p{correction}: claim {row.p_above_adjusted:.2g}, reverse "
            f"{row.p_below_adjusted:.2g}, equivalence {row.p_equivalent_adjusted:.2g}{flags}")


def flagged_arms(row, with_condition: bool = True) -> list[tuple[str, str]]:
    """``(arm, flag)`` for each flagged arm of a scored claim (a row of the contrast table, as a Series or a
    mapping; an arm compared with itself once): the arm named by its method, and by its condition with
    ``with_condition``."""
    flagged = []
    for side in ("left", "right"):
        flag = row.get(f"{side}_flag") or ""
        name = row.get(f"{side}_name", "")
        if with_condition:
            name += f" at `{row.get(f'{side}_condition')}`"
        if flag and (name, flag) not in flagged:
            flagged.append((name, flag))
    return flagged


def claim_result(table: pd.DataFrame, contrast: Contrast) -> str:
    """One claim's verdict as the scale section prints it: ``**verdict**`` with its paired difference, 95%
    t-interval and pairs, or ``not run``; for a claim with a flagged arm (:func:`flagged_arms`), that arm's flag and
    no verdict."""
    row = table.set_index("claim").loc[contrast.claim]
    flagged = flagged_arms(row, with_condition=False)
    if flagged:
        return "; ".join(f"{name}: {flag}" for name, flag in flagged) + ": **no verdict**"
    if row["verdict"] in ("not run", "identical runs"):
        return f"**{row['verdict']}**"
    return (f"**{row['verdict']}** ({row['difference']:+.3f}, [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], "
            f"{row['pairs']} pairs)")


def not_played(table: pd.DataFrame, contrasts: tuple[Contrast, ...]) -> bool:
    """Whether no claim of ``contrasts`` has run yet: its line then says so instead of giving verdicts."""
    return bool((table.set_index("claim").loc[[c.claim for c in contrasts], "verdict"] == "not run").all())


WRITTEN_AFTER_LABELS = {
    SIGN_CONTRASTS[0].claim: "the sign claim over time on the `mechanism` experiment's seeds 0–7, written after "
                             "those runs were read by stretch (exploratory)",
}
"""How the opening section names a claim written after every run it scores (:func:`written_after_runs`)."""


def written_after_runs(contrasts: tuple[Contrast, ...] = CONTRASTS) -> list[Contrast]:
    """The claims written after all of their runs: both arms declared as played before the claim
    (``Contrast.played_before``)."""
    return [c for c in contrasts if {c.left, c.right} <= set(c.played_before)]


def provenance_line(contrasts: tuple[Contrast, ...] = CONTRASTS) -> str:
    """The opening section's first line: what the study measures, and which claims were written before their
    runs."""
    after = [WRITTEN_AFTER_LABELS.get(c.claim, c.claim) for c in written_after_runs(contrasts)]
    if after:
        written = (f"every claim written before its runs but {'one' if len(after) == 1 else len(after)}: "
                   + "; ".join(after))
    else:
        written = "every claim written before its runs"
    return ("- **What it can say.** How each rule acts when μ and π_θ differ by a known, injected amount, on a tiny "
            f"Sudoku policy, paired by seed (eight seeds for every primary claim), with {written}. A claim against "
            "a reference arm reused from an earlier experiment was written after that arm's runs and before its "
            "other arm's.")


SCALE_MARKER = "<!-- cpu-study:scale -->"
"""The page's opening section, what this scale can and cannot say, sits between two of these lines."""
SCALE_CANNOT = (
    "- **What it cannot say.** Whether the paper's regime holds at scale: a mismatch that accumulates over long "
    "training at a small learning rate (no precision mismatch grew here in 50 steps), a real inference engine's "
    "kernels (the int4 copy is simulated quantisation of the learner), top-K at a real vocabulary, or "
    "generalisation beyond one task's held-out puzzles. Each claim below is about this policy, this task and these "
    "settings."
)


@dataclass(frozen=True)
class ScaleEvidence:
    """What the opening section reads beside the scored claims, from the study's runs (:func:`scale_evidence`)."""

    regime: pd.DataFrame
    """The ``regime`` arms' held-out success (:func:`~studies.cpu.report.held_out_table` of ``mb4-int4``)."""
    signs: pd.DataFrame
    """The sign claim by stretch of the run (:func:`~studies.cpu.report.sign_shares_by_stretch`)."""
    halves: pd.DataFrame
    """What DPPO-Binary-KL blocked in each half under the mechanism's conditions
    (:func:`~studies.cpu.report.blocked_by_half`)."""
    blocked: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))
    """Each arm's mean blocked share over its runs (``masked``), by (condition, method): what the matched and placebo
    lines print beside their verdicts. A calibrated arm's step 1 is in it, at the preset's own band."""
    calibrated: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))
    """Each run's blocked share under the calibrated conditions (:data:`CALIBRATED_CONDITIONS`) from step 2 on
    (:data:`~studies.cpu.report.CALIBRATED_STEPS`: a calibrated band's own steps), by (condition, method, seed)."""
    stretches: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Each arm's blocked share under the calibrated conditions by stretch of the run (:data:`REFERENCE_STRETCHES`),
    means over seeds, indexed by (condition, method): how DPPO-Binary-KL's own share moved after the step the
    others were calibrated on."""
    held: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Per v6 condition (:data:`~studies.cpu.report.HELD_STEPS`), what each held arm blocked beside what it was set
    to block and beside DPPO-Binary-KL's own runs (:func:`~studies.cpu.report.held_strength`)."""


MECHANISM_CONDITIONS = ("mech-int4", "mech-int4-redraw", "mech-noise")
"""The mechanism's conditions: the fixed int4 grid, the grid redrawn at every re-sync, and the matched noise."""
CALIBRATED_CONDITIONS = ("mech-int4", "field-mb4")
"""The conditions of the calibrated arms (``matched``, ``matched_more`` and ``band_sweep``; ``matched_stale``)."""
HALVES_CONDITION = HALVES_CONTRASTS[0].left[1]
"""The condition of the ``halves`` experiment (staleness, where DPPO-Binary-KL's mask binds and helps)."""
REFERENCE_STRETCHES = ((1, 10), (11, 25), (26, 50))
"""The stretches of a run over which the matched lines print DPPO-Binary-KL's own blocked share."""


def scale_evidence(df: pd.DataFrame, outcomes: pd.DataFrame) -> ScaleEvidence:
    """The :class:`ScaleEvidence` of a study: its long table ``df`` and its runs' ``outcomes``."""
    stretches = pd.DataFrame({f"{first}-{last}": blocked_share(df, CALIBRATED_CONDITIONS, (first, last))
                              for first, last in REFERENCE_STRETCHES})
    held = {condition: held_strength(df, condition, tuple(method for method, _ in HELD_ARMS))
            for condition in HELD_STEPS}
    return ScaleEvidence(held_out_table(outcomes, ("mb4-int4",)), sign_shares_by_stretch(df, "mech-int4", "pg_is"),
                         blocked_by_half(df, (*MECHANISM_CONDITIONS, HALVES_CONDITION)),
                         outcomes.groupby(["condition", "arm_method"])["masked"].mean(),
                         blocked_per_run(df, CALIBRATED_CONDITIONS, CALIBRATED_STEPS), stretches, held)


def scale_lines(table: pd.DataFrame, evidence: ScaleEvidence | None = None) -> list[str]:
    """The page's opening section (between :data:`SCALE_MARKER` lines), from the scored claims: what a tiny policy
    on two cores can and cannot say, the result of Takeaway 2 in its regime, the mechanism's claims, the later
    rules' (:func:`frontier_line`), v6's held bands (:func:`held_line`), cells' placebo and Takeaway 3; with
    ``evidence``, what bounds the verdicts (what each arm blocked, and against what)."""
    return [
        provenance_line(),
        SCALE_CANNOT,
        regime_line(table, evidence),
        regime_lr_line(table, evidence),
        mechanism_line(table, evidence),
        frontier_line(table, FRONTIER_ARMS, FRONTIER_CONTRASTS, pg_is_family=FRONTIER_PG_IS_FAMILY),
        frontier_line(table, FRONTIER_MORE_ARMS, FRONTIER_MORE_CONTRASTS, pg_is_family=FRONTIER_PG_IS_FAMILY),
        frontier_line(table, FRONTIER_STALE_ARMS, FRONTIER_STALE_CONTRASTS, FRONTIER_STALE_HEADING,
                      FRONTIER_STALE_PG_IS_FAMILY),
        *(matched_line(table, arms, contrasts, heading, evidence, family) for arms, contrasts, heading, family in (
            (MATCHED_ARMS, MATCHED_CONTRASTS, MATCHED_HEADING, MATCHED_PG_IS_FAMILY),
            (MATCHED_MORE_ARMS, MATCHED_MORE_CONTRASTS, MATCHED_HEADING, MATCHED_PG_IS_FAMILY),
            (MATCHED_ARMS + MATCHED_MORE_ARMS, MATCHED_STALE_CONTRASTS, MATCHED_STALE_HEADING,
             MATCHED_STALE_PG_IS_FAMILY))),
        band_sweep_line(table, evidence),
        *(held_line(table, contrasts, heading, evidence) for contrasts, heading in (
            (HELD_CONTRASTS, HELD_HEADING), (HELD_STALE_CONTRASTS, HELD_STALE_HEADING))),
        placebo_line(table, evidence),
        placebo_cells_line(table, evidence),
        halves_line(table, evidence),
        sign_line(table),
    ]


def regime_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on Takeaway 2 in its regime: both twin contrasts, and with ``evidence`` how far
    every arm's held-out success fell (a contrast among failing runs)."""
    regime = REGIME_CONTRASTS
    line = (f"- **Takeaway 2 in its regime** (int4 copy, four quarter-batch steps per rollout: μ, π_θ' and π_θ all "
            f"differ). DPPO-Binary-KL anchored on μ against the same mask on the recomputed π_θ': "
            f"{claim_result(table, regime[0])}; DPPO-Binary-TV likewise: {claim_result(table, regime[1])}.")
    held = evidence.regime if evidence is not None else pd.DataFrame()
    if held.empty:
        return line
    return (f"{line} Every arm broke: the int4 copy's held-out success fell from {held['copy_start'].mean():.2f} "
            f"to {held['copy_end'].min():.3f}–{held['copy_end'].max():.3f} (means per arm), lower at the end in "
            f"{int(held['ended_lower'].sum())} of {int(held['runs'].sum())} runs of {len(held)} arms, so these "
            "verdicts say nothing about the anchor where training works.")


REGIME_LR_ARMS = (("dppo_binary_kl", "DPPO-Binary-KL on μ"), ("dppo_binary_kl_recompute", "on π_θ'"),
                  ("dppo_binary_tv", "DPPO-Binary-TV on μ"), ("dppo_binary_tv_recompute", "on π_θ'"))
"""The ``regime_lr`` arms whose blocked shares its line prints: each mask on either anchor."""


def regime_lr_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on Takeaway 2 at lr 1e-4: both twin contrasts, whether the μ-anchored arm and its
    twin learn at all (held-out success, end against start), and with ``evidence`` whether both anchors' masks
    fire (their blocked shares)."""
    kl, tv, *_, kl_learns, twin_learns = REGIME_LR_CONTRASTS
    heading = ("- **Takeaway 2 where training survives** (`regime_lr`: the regime's int4 copy and four quarter-batch "
               "steps per rollout, at lr 1e-4)")
    if not_played(table, (kl,)):
        return f"{heading}: not played yet."
    line = (f"{heading}. DPPO-Binary-KL anchored on μ against the same mask on the recomputed π_θ': "
            f"{claim_result(table, kl)}; DPPO-Binary-TV likewise: {claim_result(table, tv)}. Does training survive "
            f"(the int4 copy's held-out success, end against start)? DPPO-Binary-KL: {claim_result(table, kl_learns)}; "
            f"its twin: {claim_result(table, twin_learns)}.")
    blocked = evidence.blocked if evidence is not None else pd.Series(dtype=float)
    shares = [(label, blocked.get(("mb4-int4-lr1e-4", method))) for method, label in REGIME_LR_ARMS]
    if any(share is None or pd.isna(share) for _, share in shares):
        return line
    listed = "; ".join(f"{label} {100 * share:.2f}%" for label, share in shares)
    return f"{line} Blocked over the run (mean over seeds): {listed}."


def mechanism_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on the int4 result's mechanism: its primary claims and the learner's exploratory
    one, and with ``evidence`` the sign claim by stretch and what the two controls blocked."""
    mechanism = MECHANISM_CONTRASTS
    signs = evidence.signs if evidence is not None else pd.DataFrame()
    halves = evidence.halves if evidence is not None else pd.DataFrame()
    stretches = ""
    if {"1-10", "26-50"} <= set(signs.index):
        start, late = signs.loc["1-10"], signs.loc["26-50"]
        stretches = (f"; not at the start (steps 1–10: {start['difference']:+.3f}, [{start['low']:+.3f}, "
                     f"{start['high']:+.3f}]), built up later (steps 26–50: {late['difference']:+.3f}, "
                     f"[{late['low']:+.3f}, {late['high']:+.3f}])")
    grid, noise = "", ""
    if {(condition, "dppo_binary_kl") for condition in MECHANISM_CONDITIONS} <= set(halves.index):
        fixed, redrawn, noisy = (halves.loc[(condition, "dppo_binary_kl")] for condition in MECHANISM_CONDITIONS)
        negative, positive = list(halves.columns[:2])
        grid = (f"; under it the mask blocked {redrawn['all']:.2f}% of the tokens, under the fixed grid "
                f"{fixed['all']:.2f}%, so the two differ in how much they block too")
        noise = (f"; a one-sided control: under it the mask blocked {noisy[positive]:.2f}% of the tokens in the A>0 "
                 f"half and {noisy[negative]:.2f}% in the A<0 half (under the fixed grid {fixed[negative]:.2f}%), so "
                 "it controls for the A>0 half only")
    return (f"- **The int4 result's mechanism** (one step per rollout). In PG-IS runs, Â < 0 is more common among "
            f"the tokens over δ where μ > π than where μ < π, pooled over the run: "
            f"{claim_result(table, mechanism[0])}{stretches}. PG-IS against the whole μ-anchored mask: "
            f"{claim_result(table, mechanism[1])}; against its A<0 half alone: {claim_result(table, mechanism[2])}; "
            f"against its A>0 half alone: {claim_result(table, mechanism[3])}. "
            "The fp32 learner's held-out success under the mask, its start "
            f"against its end: {claim_result(table, mechanism[6])}; against PG-IS's fp32 learner at the end "
            f"(exploratory): {claim_result(table, mechanism[7])}. A grid redrawn at every re-sync against the fixed "
            f"one: {claim_result(table, mechanism[4])}{grid}. Matched noise: {claim_result(table, mechanism[5])}"
            f"{noise}.")


FRONTIER_INT4_HEADING = ("The field after DPPO under the int4 copy", "one step per rollout; the `mechanism` "
                         "experiment's DPPO-Binary-KL and PG-IS runs as references")
"""The ``frontier`` and ``frontier_more`` lines' heading: the setting, in bold, and after the experiment's name how
it was played."""
FRONTIER_STALE_HEADING = ("The field after DPPO under staleness", "four quarter-batch steps per rollout, an fp32 "
                          "copy; DPPO-Binary-KL and PG-IS played beside them")
"""The ``frontier_stale`` line's heading."""


class PgIsFamily(NamedTuple):
    """Claims against PG-IS that ask one question of the same PG-IS runs, and the experiments they belong to."""

    experiments: tuple[str, ...]
    claims: tuple[Contrast, ...]


def frontier_line(table: pd.DataFrame, arms: tuple[tuple[str, str], ...], contrasts: tuple[Contrast, ...],
                  heading: tuple[str, str] = FRONTIER_INT4_HEADING,
                  pg_is_family: PgIsFamily | None = None) -> str:
    """The scale section's line on a field experiment: each of its later rules (``arms``) against DPPO-Binary-KL
    (primary) and against PG-IS (exploratory), as scored (``contrasts``, in that order); a rule whose arm is
    flagged gets its flag instead of a verdict (:func:`field_result`). With ``pg_is_family``, the claims against
    PG-IS that ask one question of the same PG-IS runs, those against PG-IS are printed Holm-corrected over that
    family (:func:`~studies.cpu.report.pooled_holm`, :func:`pooled_result`); else as scored, uncorrected."""
    against_dppo, against_pg_is = contrasts[:len(arms)], contrasts[len(arms):]
    setting, played = heading
    if pg_is_family is not None:
        pooled = pooled_holm(table, tuple(c.claim for c in pg_is_family.claims))
        named = " and ".join(f"`{e}`" for e in pg_is_family.experiments)
        against = (f"Against PG-IS (exploratory; Holm over the {len(pooled)} claims against PG-IS of {named}, one "
                   "question asked of the same PG-IS runs; Holm p: the adjusted one-sided p on the side of the "
                   "difference): "
                   + "; ".join(pooled_result(table, pooled, label, contrast)
                               for (_, label), contrast in zip(arms, against_pg_is, strict=False)))
    else:
        against = ("Against PG-IS (exploratory, uncorrected): "
                   + "; ".join(field_result(table, label, contrast)
                               for (_, label), contrast in zip(arms, against_pg_is, strict=False)))
    return (f"- **{setting}** (`{contrasts[0].experiment}`, {played}). Against DPPO-Binary-KL: "
            + "; ".join(field_result(table, label, contrast)
                        for (_, label), contrast in zip(arms, against_dppo, strict=False))
            + f". {against}.")


def pooled_result(table: pd.DataFrame, pooled: pd.DataFrame, label: str, contrast: Contrast) -> str:
    """``label`` and the claim's verdict Holm-corrected over its family (``pooled``:
    :func:`~studies.cpu.report.pooled_holm`), with its paired difference, 95% t-interval, pairs and the adjusted
    one-sided p on the side of the difference; where the verdict as scored (uncorrected) differs, that one too with
    its p. A flagged arm gets its flag (:func:`field_result`)."""
    row = table.set_index("claim").loc[contrast.claim]
    if row["left_flag"] or row["right_flag"] or row["verdict"] in ("not run", "identical runs"):
        return field_result(table, label, contrast)
    corrected = pooled.loc[contrast.claim]
    side = "p_above" if row["difference"] >= 0 else "p_below"
    text = (f"{label} **{corrected['verdict']}** ({row['difference']:+.3f}, [{row['ci_low']:+.3f}, "
            f"{row['ci_high']:+.3f}], {row['pairs']} pairs; Holm p {corrected[f'{side}_adjusted']:.2g}")
    if corrected["verdict"] != row["verdict"]:
        text += f"; uncorrected p {row[side]:.2g}: **{row['verdict']}** as scored"
    return text + ")"


MATCHED_HEADING = ("The field with bands calibrated to DPPO-Binary-KL's first-step share under the int4 copy",
                   "one step per rollout; each band calibrated per run on step 1 to block as many tokens as "
                   "DPPO-Binary-KL there, and kept from step 2; the `mechanism` experiment's DPPO-Binary-KL and PG-IS "
                   "runs as references")
"""The ``matched`` and ``matched_more`` lines' heading."""
MATCHED_STALE_HEADING = ("The field with bands calibrated to DPPO-Binary-KL's first-step share under staleness",
                         "four quarter-batch steps per rollout, an fp32 copy; calibrated as under int4; "
                         "`frontier_stale`'s DPPO-Binary-KL and PG-IS runs as references")
"""The ``matched_stale`` line's heading."""
MATCHED_PG_IS_FAMILY = PgIsFamily(
    (MATCHED_CONTRASTS[0].experiment, MATCHED_MORE_CONTRASTS[0].experiment),
    MATCHED_CONTRASTS[len(MATCHED_ARMS):] + MATCHED_MORE_CONTRASTS[len(MATCHED_MORE_ARMS):])
"""The claims against PG-IS of ``matched`` and ``matched_more``: one question (a rule calibrated to DPPO-Binary-KL's
first-step share against no trust region, under int4) of the same PG-IS runs, split over two experiments only
because each is its own family for its primary claims; the opening section prints them Holm-corrected together."""
FRONTIER_PG_IS_FAMILY = PgIsFamily(
    (FRONTIER_CONTRASTS[0].experiment, FRONTIER_MORE_CONTRASTS[0].experiment),
    FRONTIER_CONTRASTS[len(FRONTIER_ARMS):] + FRONTIER_MORE_CONTRASTS[len(FRONTIER_MORE_ARMS):])
"""The claims against PG-IS of ``frontier`` and ``frontier_more``: one question (a field rule at its source's band
against no trust region, under int4) of the same PG-IS runs."""
FRONTIER_STALE_PG_IS_FAMILY = PgIsFamily((FRONTIER_STALE_CONTRASTS[0].experiment,),
                                         FRONTIER_STALE_CONTRASTS[len(FRONTIER_STALE_ARMS):])
"""The claims against PG-IS of ``frontier_stale``: the same question under staleness, of its own PG-IS runs."""
MATCHED_STALE_PG_IS_FAMILY = PgIsFamily((MATCHED_STALE_CONTRASTS[0].experiment,),
                                        MATCHED_STALE_CONTRASTS[len(MATCHED_ARMS + MATCHED_MORE_ARMS):])
"""The claims against PG-IS of ``matched_stale``: the calibrated rules' question under staleness."""



def matched_line(table: pd.DataFrame, arms: tuple[tuple[str, str], ...], contrasts: tuple[Contrast, ...],
                 heading: tuple[str, str], evidence: ScaleEvidence | None,
                 pg_is_family: PgIsFamily | None = None) -> str:
    """A matched experiment's line (:func:`frontier_line`, its claims against PG-IS Holm-corrected over
    ``pg_is_family`` where given), and with ``evidence``, once its arms have run, what each blocked beside
    DPPO-Binary-KL: over the run, step 1 included (where a calibrated arm ran at its preset's own band), and from
    step 2 on, at the calibrated band; how far the calibrated arms' shares strayed from DPPO-Binary-KL's on the
    same seed, and how DPPO-Binary-KL's own share moved over the run (a match on step 1 is no match after it)."""
    if not_played(table, contrasts):
        return f"- **{heading[0]}** (`{contrasts[0].experiment}`, {heading[1]}): not played yet."
    line = frontier_line(table, arms, contrasts, heading, pg_is_family)
    if evidence is None:
        return line
    condition = contrasts[0].left[1]
    methods = ("dppo_binary_kl", *(method for method, _ in arms))
    labels = ("DPPO-Binary-KL", *(label for _, label in arms))
    whole = [evidence.blocked.get((condition, method)) for method in methods]
    steady = evidence.calibrated.groupby(["condition", "arm_method"]).mean() if len(evidence.calibrated) else (
        pd.Series(dtype=float))
    later = [steady.get((condition, method)) for method in methods]
    stretches = [evidence.stretches.get(f"{first}-{last}", pd.Series(dtype=float)).get((condition, methods[0]))
                 for first, last in REFERENCE_STRETCHES]
    if any(share is None or pd.isna(share) for share in (*whole, *later, *stretches)):
        return line
    low, high = blocked_ratio_range(evidence.calibrated, condition, methods[1:])
    listed = "; ".join(f"{label} {100 * share:.2f}%" for label, share in zip(labels, whole, strict=True))
    listed_later = "; ".join(f"{label} {100 * share:.2f}%" for label, share in zip(labels, later, strict=True))
    moved = ", then ".join(f"{100 * share:.2f}% (steps {first}–{last})"
                           for share, (first, last) in zip(stretches, REFERENCE_STRETCHES, strict=True))
    return (f"{line} Blocked (mean over seeds) over the run, step 1 included, where each calibrated band was still "
            f"its preset's own: {listed}; from step 2 on, at the calibrated bands: {listed_later}. Strength was not "
            f"held over the run: from step 2 on a rule's share ranged {low:.2g}× to {high:.2g}× DPPO-Binary-KL's on "
            f"the same seed, and DPPO-Binary-KL's own share was {moved}.")


def band_sweep_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on strength against outcome: for each swept rule its verdicts calibrated to
    DPPO-Binary-KL's first-step share against 8% (primary) and 2%, and 2% against 8%, and with ``evidence`` what
    each calibration blocked over its runs, step 1 (at the preset's own band) included and from step 2 on."""
    heading = ("- **Strength against outcome under the int4 copy** (`band_sweep`, one step per rollout: GSPO, VACO and "
               "TRM-Avg calibrated per run on step 1 to DPPO-Binary-KL's share there, to 2% and to 8% of the tokens, "
               "each band kept from step 2)")
    if not_played(table, SWEEP_CONTRASTS[:1]):
        return f"{heading}: not played yet."
    blocked = evidence.blocked if evidence is not None else pd.Series(dtype=float)
    calibrated = evidence.calibrated if evidence is not None else pd.Series(dtype=float)
    steady = calibrated.groupby(["condition", "arm_method"]).mean() if len(calibrated) else pd.Series(dtype=float)
    parts = []
    for index, (preset, both, label) in enumerate(SWEEP_RULES):
        strong, weak, between = (SWEEP_CONTRASTS[index + len(SWEEP_RULES) * k] for k in range(3))
        part = (f"{label}: calibrated to DPPO-Binary-KL's first-step share against 8% {claim_result(table, strong)}, "
                f"against 2% {claim_result(table, weak)}; 2% against 8% {claim_result(table, between)}")
        methods = (matched(preset, both), *(swept(preset, both, target) for target in SWEEP_TARGETS))
        shares = [blocked.get(("mech-int4", method)) for method in methods]
        later = [steady.get(("mech-int4", method)) for method in methods]
        if not any(share is None or pd.isna(share) for share in (*shares, *later)):
            part += (" (blocked over the run, step 1 at the preset's own band included: "
                     + ", ".join(f"{100 * share:.2f}%" for share in shares) + "; from step 2 on: "
                     + ", ".join(f"{100 * share:.2f}%" for share in later) + ")")
        parts.append(part)
    return f"{heading}. " + "; ".join(parts) + "."


def placebo_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on the mechanism's placebo (matched on the sign of Â, the μ bucket and the rate,
    not on the side of μ − π): its two primary claims and the exploratory one, and with ``evidence`` what each
    placebo blocked against the rate it was set to."""
    from studies.cpu.placebo import PLACEBO_RATES

    negative, positive, halves = PLACEBO_CONTRASTS
    line = (f"- **The mechanism's placebo** (`placebo`, an fp32 sampler, one step per rollout: a random set of one "
            f"half's tokens blocked at the rate int4's mask blocked that half, per μ bucket; matched on the sign of Â, "
            f"the μ bucket and the rate, not on the side of μ − π, which an fp32 sampler leaves to rounding). PG-IS "
            f"against the A<0 half's placebo: {claim_result(table, negative)}; against the A>0 half's: "
            f"{claim_result(table, positive)}; the A>0 half's against the A<0 half's (exploratory): "
            f"{claim_result(table, halves)}.")
    blocked = evidence.blocked if evidence is not None else pd.Series(dtype=float)
    shares = [blocked.get(("v5-fp32", arm)) for arm in ("placebo_neg", "placebo_pos")]
    if any(share is None or pd.isna(share) for share in shares):
        return line
    rates = [100 * sum(PLACEBO_RATES[side].values()) for side in ("negative", "positive")]
    return (f"{line} They blocked {100 * shares[0]:.2f}% and {100 * shares[1]:.2f}% of the A ≠ 0 tokens (set to "
            f"{rates[0]:.2f}% and {rates[1]:.2f}%, int4's means over its runs, at a constant rate where int4's grew "
            "over a run), with no engine error: so they test how many tokens of a half are blocked, not which.")


HELD_HEADING = ("The field with bands held at DPPO-Binary-KL's strength at every step under the int4 copy",
                "one step per rollout; each band set on every step's batch, before its update, to block as many "
                "tokens as DPPO-Binary-KL's mask does there; the `mechanism` experiment's DPPO-Binary-KL and PG-IS "
                "runs as references")
"""The ``held`` line's heading."""
HELD_STALE_HEADING = ("The field with bands held at DPPO-Binary-KL's strength under staleness",
                      "four quarter-batch steps per rollout, an fp32 copy; each band set on a step's update to block "
                      "as many tokens as DPPO-Binary-KL's mask does there, and acting from the next step; "
                      "`frontier_stale`'s DPPO-Binary-KL and PG-IS runs as references")
"""The ``held_stale`` line's heading."""


def family_note(table: pd.DataFrame, contrasts: tuple[Contrast, ...]) -> str:
    """How the verdicts of ``contrasts`` (one family) are corrected, as scored: Holm over the family once its
    primary claims have their pairs, else uncorrected and exploratory."""
    row = table.set_index("claim").loc[contrasts[0].claim]
    if row["family"] == "primary" and row["holm_size"]:
        return f"Holm over the {row['holm_size']}"
    return "uncorrected until every seed has run"


def held_line(table: pd.DataFrame, contrasts: tuple[Contrast, ...], heading: tuple[str, str],
              evidence: ScaleEvidence | None) -> str:
    """A held experiment's line: each held arm against DPPO-Binary-KL and against PG-IS (two families, each
    corrected as :func:`family_note` says), and with ``evidence`` the strength each band held
    (:func:`held_strength_text`)."""
    if not_played(table, contrasts):
        return f"- **{heading[0]}** (`{contrasts[0].experiment}`, {heading[1]}): not played yet."
    against_dppo, against_pg_is = contrasts[:len(HELD_ARMS)], contrasts[len(HELD_ARMS):]
    verdicts = ["; ".join(field_result(table, label, contrast)
                          for (_, label), contrast in zip(HELD_ARMS, claims, strict=True))
                for claims in (against_dppo, against_pg_is)]
    line = (f"- **{heading[0]}** (`{contrasts[0].experiment}`, {heading[1]}). Against DPPO-Binary-KL "
            f"(primary, {family_note(table, against_dppo)}): {verdicts[0]}. Against PG-IS "
            f"(primary, {family_note(table, against_pg_is)}): {verdicts[1]}.")
    condition = contrasts[0].left[1]
    strength = evidence.held.get(condition, pd.DataFrame()) if evidence is not None else pd.DataFrame()
    return f"{line} {held_strength_text(strength, condition)}" if len(strength) else line


def held_strength_text(strength: pd.DataFrame, condition: str) -> str:
    """What each held band blocked (``strength``: :func:`~studies.cpu.report.held_strength`) against what it was
    set to block on its own batches, and against DPPO-Binary-KL's own runs, with the arms outside the design's
    :data:`~studies.cpu.report.HELD_WITHIN`."""
    labels = dict(HELD_ARMS)
    first, _ = HELD_STEPS[condition]
    arms = "; ".join(f"{labels[method]} {row['blocked %']:.2f}% ({row['to target']:.2f}× its target, "
                     f"{row['to reference']:.2f}× DPPO-Binary-KL's runs, per seed {row['lowest']:.2f}–"
                     f"{row['highest']:.2f}×)" for method, row in strength.iterrows())
    outside = [labels[method] for method in strength.index[~strength["within"].astype(bool)]]
    verdict = (f"every arm within {HELD_WITHIN}× of DPPO-Binary-KL's runs" if not outside else
               f"outside {HELD_WITHIN}× of DPPO-Binary-KL's runs, so compared at another strength than its runs': "
               + ", ".join(outside))
    return (f"Blocked from step {first} on (means over seeds; DPPO-Binary-KL's runs "
            f"{strength['reference %'].iloc[0]:.2f}%; a target is DPPO-Binary-KL's mask on the arm's own batch): "
            f"{arms}. The design asks for {HELD_WITHIN}×: {verdict}.")


def placebo_cells_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on v6's placebo in int4's own cells: its three primary claims and the
    exploratory one, and with ``evidence`` what each placebo blocked in int4's cells and in the others beside the
    mask."""
    to_pg_is, to_mask, cells, control = PLACEBO_CELLS_CONTRASTS
    heading = ("- **The mechanism's placebo in int4's own cells** (`placebo_cells`, the int4 copy, one step per "
               "rollout: random tokens of int4's two cells, Â < 0 where μ > π and Â > 0 where μ < π, at the rates "
               "its mask blocked each per μ bucket; its control blocks the other two cells at the same rates)")
    if not_played(table, (to_pg_is,)):
        return f"{heading}: not played yet."
    line = (f"{heading}. Primary ({family_note(table, PLACEBO_CELLS_CONTRASTS[:3])}): PG-IS against the placebo "
            f"(the mechanism predicts no difference) {claim_result(table, to_pg_is)}; the placebo against "
            f"DPPO-Binary-KL {claim_result(table, to_mask)}; the control against the placebo "
            f"{claim_result(table, cells)}. Exploratory: PG-IS against the control {claim_result(table, control)}.")
    return line + blocked_cells_text(evidence, "mech-int4", (("dppo_binary_kl", "DPPO-Binary-KL"),
                                                            ("placebo_cells", "the placebo"),
                                                            ("placebo_cells_other", "the control")))


def blocked_cells_text(evidence: ScaleEvidence | None, condition: str, arms: tuple[tuple[str, str], ...]) -> str:
    """`` Blocked ...``: what each of ``arms`` blocked under ``condition`` in the mask's A<0 half, its A>0 half and
    the other cells (% of the A ≠ 0 tokens, means over steps and seeds; :func:`blocked_by_half`), or nothing before
    they have run."""
    halves = evidence.halves if evidence is not None else pd.DataFrame()
    if not all((condition, method) in halves.index for method, _ in arms):
        return ""
    negative, positive, other = halves.columns[:3]
    shares = "; ".join(f"{label} {row[negative]:.2f}%, {row[positive]:.2f}% and {row[other]:.2f}%"
                       for label, row in ((label, halves.loc[(condition, method)]) for method, label in arms))
    return f" Blocked in the A<0 half, the A>0 half and the other cells (% of the A ≠ 0 tokens): {shares}."


def halves_line(table: pd.DataFrame, evidence: ScaleEvidence | None) -> str:
    """The opening section's line on Takeaway 3 where the mask binds (staleness): its three primary claims, the two
    exploratory ones, and with ``evidence`` what each half blocked beside the whole mask."""
    negative_vs_pg_is, negative_vs_positive, whole_vs_positive, whole_vs_negative, positive_vs_pg_is = (
        HALVES_CONTRASTS)
    heading = ("- **Takeaway 3 where the mask helps** (`halves`, staleness: four quarter-batch steps per rollout, an "
               "fp32 copy; DPPO-Binary-KL's mask with one half switched off)")
    if not_played(table, (negative_vs_pg_is,)):
        return f"{heading}: not played yet."
    line = (f"{heading}. Primary ({family_note(table, HALVES_CONTRASTS[:3])}): the A<0 half alone against PG-IS "
            f"{claim_result(table, negative_vs_pg_is)}; against the A>0 half alone "
            f"{claim_result(table, negative_vs_positive)}; the whole mask against the A>0 half alone "
            f"{claim_result(table, whole_vs_positive)}. Exploratory: the whole mask against the A<0 half alone (the "
            f"paper: comparable) {claim_result(table, whole_vs_negative)}; the A>0 half alone against PG-IS "
            f"{claim_result(table, positive_vs_pg_is)}.")
    return line + blocked_cells_text(evidence, HALVES_CONDITION, (("dppo_binary_kl", "the whole mask"),
                                                                 ("dppo_binary_kl_neg", "the A<0 half"),
                                                                 ("dppo_binary_kl_pos", "the A>0 half")))


def sign_line(table: pd.DataFrame) -> str:
    """The opening section's line on the sign claim over time: on the ``mechanism`` runs (written after they were
    read by stretch: exploratory) and on the ``signs`` experiment's new seeds (primary)."""
    seen, over_time, pooled = SIGN_CONTRASTS
    return (f"- **The sign claim over time** (PG-IS under the int4 copy, one step per rollout: the sign difference "
            f"over steps 26–50 against steps 1–10, within each run). On the `mechanism` experiment's seeds 0–7, "
            f"written after they were read by stretch (exploratory): {claim_result(table, seen)}. On new seeds 8–15 "
            f"(`signs`): over time {claim_result(table, over_time)}; pooled over the run "
            f"{claim_result(table, pooled)}.")


def field_result(table: pd.DataFrame, label: str, contrast: Contrast) -> str:
    """``label`` and the claim's verdict (:func:`claim_result`), or, when the rule's own arm is flagged, ``label``:
    its flag and no verdict (a flagged reference arm is named by :func:`claim_result`)."""
    row = table.set_index("claim").loc[contrast.claim]
    if row["left_flag"]:
        return f"{label}: {row['left_flag']}: **no verdict**"
    return f"{label} {claim_result(table, contrast)}"


def scale_block(text: str) -> list[str]:
    """The lines between the two :data:`SCALE_MARKER` lines of ``text``."""
    return block(text, SCALE_MARKER)


def replace_scale(text: str, lines: list[str]) -> str:
    """``text`` with its scale section replaced by ``lines``."""
    return replace_block(text, SCALE_MARKER, lines)


SUMMARY_MARKER = "<!-- cpu-study:summary -->"
"""The summary of the study in docs/cpu-study.md sits between two of these lines."""


def readme_summary(study_dir: PathLike) -> list[str]:
    """The summary lines of the study in ``study_dir``, scored as the report notebook scores them."""
    return readme_blocks(study_dir)[0]


def readme_blocks(study_dir: PathLike) -> tuple[list[str], list[str], list[str]]:
    """The page's three generated blocks for the study in ``study_dir``, scored once: the summary lines, the scale
    section's lines and the figures' lines."""
    df = load_study(study_dir)
    return page_blocks(df, run_outcomes(df, THRESHOLD))


def page_blocks(df: pd.DataFrame, outcomes: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The page's three generated blocks for a study's long table ``df`` and its runs' ``outcomes``: the summary
    lines and the scale section's lines, from one scoring of the claims, and the figures' lines
    (:func:`figure_lines`)."""
    table = contrast_table(outcomes)
    return summary_lines(table), scale_lines(table, scale_evidence(df, outcomes)), figure_lines(df, outcomes)


def rewrite_page(text: str, study_dir: PathLike) -> str:
    """``text`` (docs/cpu-study.md) with its summary and, where it has them, its scale section and its figures
    written from the study in ``study_dir``."""
    summary, scale, figures = readme_blocks(study_dir)
    text = replace_summary(text, summary)
    text = replace_scale(text, scale) if SCALE_MARKER in text else text
    return replace_block(text, FIGURES_MARKER, figures) if FIGURES_MARKER in text else text


FIGURES_MARKER = "<!-- cpu-study:figures -->"
"""The page's figures sit between two of these lines."""
FIGURES_LINK = FIGURES.relative_to(ROOT / "docs").as_posix()
"""Where the page links to the figures (docs/cpu-study.md's folder is docs/)."""


def figure_files(df: pd.DataFrame, outcomes: pd.DataFrame) -> list[tuple[str, str]]:
    """The report's figures of a study, as ``(file name, title)``: the learning curves of each task and condition,
    in the order the report draws them, and strength against outcome when the study has its arms
    (:func:`~studies.cpu.report.sweep_arms`)."""
    pairs = df[["task", "condition"]].drop_duplicates().itertuples(index=False)
    figures = [(curves_file(task, condition), f"{task}, {condition}") for task, condition in pairs]
    if not strength_table(outcomes, STRENGTH_CONDITION, sweep_arms()).empty:
        figures.append((STRENGTH_FILE, f"{STRENGTH_CONDITION}: strength against outcome"))
    return figures


def figure_lines(df: pd.DataFrame, outcomes: pd.DataFrame) -> list[str]:
    """The page's figures block: each of :func:`figure_files` as an image linked from the page, one per
    paragraph."""
    images = [f"![{title}]({FIGURES_LINK}/{name})" for name, title in figure_files(df, outcomes)]
    return [line for image in images for line in (image, "")][:-1]


def block(text: str, marker: str) -> list[str]:
    """The lines between the two ``marker`` lines of ``text``."""
    parts = text.split(marker + "\n")
    if len(parts) != 3:
        raise ValueError(f"expected exactly two {marker!r} lines, found {len(parts) - 1}")
    return parts[1].splitlines()


def replace_block(text: str, marker: str, lines: list[str]) -> str:
    """``text`` with the lines between its two ``marker`` lines replaced by ``lines``."""
    block(text, marker)
    before, _, after = text.split(marker + "\n")
    return before + marker + "\n" + "".join(line + "\n" for line in lines) + marker + "\n" + after


def summary_block(text: str) -> list[str]:
    """The lines between the two :data:`SUMMARY_MARKER` lines of ``text``."""
    return block(text, SUMMARY_MARKER)


def replace_summary(text: str, lines: list[str]) -> str:
    """``text`` with its summary block replaced by ``lines``."""
    return replace_block(text, SUMMARY_MARKER, lines)
