"""The generated blocks of the CPU study's page (docs/cpu-study.md), written from the scored claims.

The page holds two blocks between marker lines: its opening section on what this scale can and cannot say
(:data:`SCALE_MARKER`, :func:`scale_lines`) and the summary of every claim with its paired difference, 95%
t-interval and verdict (:data:`SUMMARY_MARKER`, :func:`summary_lines`). The report notebook prints the same lines,
``python -m studies.cpu.pack --readme docs/cpu-study.md`` rewrites the page's blocks (:func:`rewrite_page`), and a
test checks that the page's blocks are what the committed runs give (:func:`readme_blocks`).
"""

from __future__ import annotations

import pandas as pd

from dppo_oat.analysis.runs import PathLike
from studies.cpu.claims import (FRONTIER_ARMS, FRONTIER_CONTRASTS, FRONTIER_MORE_ARMS, FRONTIER_MORE_CONTRASTS,
                                FRONTIER_STALE_ARMS, FRONTIER_STALE_CONTRASTS, MECHANISM_CONTRASTS,
                                REGIME_CONTRASTS, THRESHOLD, Contrast)
from studies.cpu.report import contrast_table, load_study, run_outcomes


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
