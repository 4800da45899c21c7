"""The CPU study's pre-registered claims: what each experiment was run to test, written down before its runs.

Each :class:`Contrast` names a claim, the paper's statement it tests (a takeaway, figure or section label), the two
arms it compares seed by seed (``(method, condition)`` of a task), the per-run number it is scored on and the
margin; :data:`CONTRASTS` lists every claim in the order it was committed. The study's runs record the commit they
ran at, and a test (``tests/test_cpu_study.py``) checks that every claim scored on a run's arm was in this file (or,
before the study had a folder of its own, in ``dppo_oat/analysis/study.py``) at that commit. Claims are added, never
changed: a new experiment appends its claims here before its first run.

This module imports nothing but the standard library, so the provenance test can execute it as it stood at any
commit. :mod:`studies.cpu.report` scores the claims on the study's runs.
"""

from __future__ import annotations

from dataclasses import dataclass

COLLAPSE_RATIO = 0.5
COLLAPSE_MIN_DROP = 0.1
"""A run *collapses* when its final training success is below ``COLLAPSE_RATIO`` of its smoothed peak and at least
``COLLAPSE_MIN_DROP`` (absolute) under it: at a success of a few %, halving is within the noise of one rollout."""

# Written down before the runs of the study's ``mismatch`` and ``staleness`` experiments, and not changed after: each
# claim, the per-run number it is scored on, the arms compared seed by seed, and the margin.
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
                       setting: str = FRONTIER, references_played_before: bool = True,
                       source: str = "the field after DPPO") -> tuple[Contrast, ...]:
    """A field experiment's claims under ``condition``: each arm against DPPO-Binary-KL (primary, Holm over
    ``experiment``), then against PG-IS (exploratory). With ``references_played_before``, both references are an
    earlier experiment's runs of the condition, declared as played before the claims; else the experiment plays them
    in its own sitting."""
    against = (("dppo_binary_kl", "DPPO-Binary-KL", "primary"), ("pg_is", "PG-IS", "exploratory"))
    return tuple(Contrast(f"{setting}: {label} beats {name}", source, (method, condition),
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

MATCHED_LIKE = "calibrate_like=dppo_binary_kl"
"""How a matched arm calibrates its band (``--tr-calibrate-like dppo_binary_kl``): per run, on its step 1's loss calls,
to block as many A ≠ 0 tokens as DPPO-Binary-KL's mask blocks on that same batch; it trains with that band from
step 2."""


def matched(preset: str, both_bands: bool = False) -> str:
    """The study's method of ``preset`` at DPPO-Binary-KL's strength (:data:`MATCHED_LIKE`); ``both_bands``: a rule
    with a sequence bound and a PPO clip moves both by one factor (``--tr-calibrate-band both``)."""
    return f"{preset}@{MATCHED_LIKE}" + (",calibrate_band=both" if both_bands else "")


MATCHED_ARMS = ((matched("gspo"), "GSPO"), (matched("vaco", True), "VACO"), (matched("dppo_binary_tv"), "DPPO-Binary-TV"),  # noqa: E501  (pre-registered, kept as committed)
                (matched("grpo_clip_higher"), "GRPO-ClipHigher"))
"""The ``matched`` experiment's arms, the first v5 sitting's: the two field rules whose source bands could not be read
as trust regions under int4 (GSPO's blocked most tokens and collapsed, VACO's blocked none), DPPO-Binary-TV (the
paper's TV mask against its KL mask, at one strength) and GRPO-ClipHigher (the ratio clip against the divergence
mask, at one strength), each calibrated to DPPO-Binary-KL's blocked share."""
MATCHED_MORE_ARMS = ((matched("ipo"), "the symmetric band (prime-rl's IPO)"), (matched("trm_max", True), "TRM-Max"),
                     (matched("trm_avg", True), "TRM-Avg"),
                     (matched("opsm", True), "DeepSeek-V3.2's off-policy sequence mask"))
"""The ``matched_more`` experiment's arms: the field rules whose source bands blocked 2–12% of the tokens under int4
(read, with verdicts, in ``frontier`` and ``frontier_more``), calibrated the same way. TRM, DeepSeek-V3.2's mask and
VACO move their sequence bound and their PPO clip together: under int4 their clip alone blocks 1.1–2.2% of step 1's
tokens, more than DPPO-Binary-KL's 0.06–0.82%, so no sequence bound alone reaches it.

Not calibrated: MinPRO (its prefix weight blocks no token at any setting; calibration refuses it) and SAPO (its gate
never sets M_t = 0, so the blocked share the degenerate-arm rule reads, ``mask/fraction``, is 0 at any τ: its arm is
flagged whatever its band, and would get no verdict)."""
MATCHED = ("at DPPO-Binary-KL's strength under an int4 copy (one step per rollout; each band calibrated per run on "
           "step 1 to block as many tokens as DPPO-Binary-KL does on that batch)")
MATCHED_STALE = ("at DPPO-Binary-KL's strength under staleness (four quarter-batch steps per rollout, fp32 copy; each "
                 "band calibrated per run on step 1 to block as many tokens as DPPO-Binary-KL does on that batch)")
MATCHED_SOURCE = "the field at matched strength"
MATCHED_CONTRASTS = frontier_contrasts(MATCHED_ARMS, "matched", "mech-int4", MATCHED, source=MATCHED_SOURCE)
"""The ``matched`` experiment's claims (eight seeds), written after the field experiments' results and before its
runs: under the int4 condition of ``frontier``, each rule calibrated to DPPO-Binary-KL's blocked share against
DPPO-Binary-KL (primary, Holm over the four) and against PG-IS (exploratory), on the ``mechanism`` experiment's
reference runs (same policy, seeds and flags, played before; a replay of DPPO-Binary-KL's seed 0 on this code gave
the same 50 steps, number for number). The field experiments compared each rule at its source's band; matched, a
comparison is of *which* tokens each rule blocks, not of how many.

Why a match per run on step 1 (``--tr-calibrate-like``), not a fixed target: step 1's rollout batch is the one batch
a calibrated arm and DPPO-Binary-KL share (same policy, same seed, nothing trained yet), so only there is "as many
tokens" a like-for-like match; from step 2 each run's batches are its own. A fixed target would be DPPO-Binary-KL's
mean share over its runs, which differs from its share at step 1 in both conditions (under int4 1.44% over the run
against 0.40% at step 1; under staleness 2.30% against 5.85%): a band set on step 1 to that share would start 3.6
times as strong as DPPO-Binary-KL under int4, and 2.5 times weaker under staleness. Each arm's blocked share over
the run is reported beside DPPO-Binary-KL's (it drifts, as DPPO-Binary-KL's own does), and an arm the degenerate-arm
rule flags gets its flag, not a verdict."""
MATCHED_MORE_CONTRASTS = frontier_contrasts(MATCHED_MORE_ARMS, "matched_more", "mech-int4", MATCHED,
                                            source=MATCHED_SOURCE)
"""The ``matched_more`` experiment's claims (eight seeds), written with ``matched``'s and for the same reasons, a
family of their own (Holm over the four) so that it stands whichever sitting plays it."""
MATCHED_STALE_CONTRASTS = frontier_contrasts(MATCHED_ARMS + MATCHED_MORE_ARMS, "matched_stale", "field-mb4",
                                             MATCHED_STALE, source=MATCHED_SOURCE)
"""The ``matched_stale`` experiment's claims (eight seeds), written with ``matched``'s and for the same reasons: the
eight calibrated rules under ``frontier_stale``'s condition, against its DPPO-Binary-KL (primary, Holm over the
eight) and PG-IS (exploratory) runs, played before."""

REGIME_LR = "Takeaway 2 where training survives (int4 copy, four quarter-batch steps per rollout, lr 1e-4)"
REGIME_LR_CONTRASTS = (
    Contrast(f"{REGIME_LR}: the DPPO-KL mask anchored on μ beats the same mask on the recomputed π_θ'", "Takeaway 2",
             ("dppo_binary_kl", "mb4-int4-lr1e-4"), ("dppo_binary_kl_recompute", "mb4-int4-lr1e-4"),
             family="primary", experiment="regime_lr"),
    Contrast(f"{REGIME_LR}: the DPPO-TV mask anchored on μ beats the same mask on the recomputed π_θ'", "Takeaway 2",
             ("dppo_binary_tv", "mb4-int4-lr1e-4"), ("dppo_binary_tv_recompute", "mb4-int4-lr1e-4"),
             family="primary", experiment="regime_lr"),
    Contrast(f"{REGIME_LR}: DPPO-Binary-KL (anchored on μ) beats MiniRL (its clip on π_θ')", "Takeaway 2",
             ("dppo_binary_kl", "mb4-int4-lr1e-4"), ("minirl", "mb4-int4-lr1e-4")),
    Contrast(f"{REGIME_LR}: DPPO-Binary-KL beats PG-IS", "fig:sanity_test",
             ("dppo_binary_kl", "mb4-int4-lr1e-4"), ("pg_is", "mb4-int4-lr1e-4")),
    Contrast(f"{REGIME_LR}: DPPO-Binary-TV beats PG-IS", "fig:sanity_test",
             ("dppo_binary_tv", "mb4-int4-lr1e-4"), ("pg_is", "mb4-int4-lr1e-4")),
    Contrast(f"{REGIME_LR}: training survives: DPPO-Binary-KL's int4 copy ends above its start on held-out success",
             "Takeaway 2 where training survives", ("dppo_binary_kl", "mb4-int4-lr1e-4"),
             ("dppo_binary_kl", "mb4-int4-lr1e-4"), "eval_after", HELD_OUT_MARGIN, right_metric="eval_before"),
    Contrast(f"{REGIME_LR}: training survives: its recomputed-anchor twin's int4 copy ends above its start on "
             "held-out success", "Takeaway 2 where training survives", ("dppo_binary_kl_recompute", "mb4-int4-lr1e-4"),
             ("dppo_binary_kl_recompute", "mb4-int4-lr1e-4"), "eval_after", HELD_OUT_MARGIN,
             right_metric="eval_before"),
)
"""The ``regime_lr`` experiment's claims (eight seeds), written before its runs: the ``regime`` experiment's at lr
1e-4, where on an fp32 copy four steps per rollout were harmless (``lr``) and the ``regime`` runs' collapse should
not happen. The two twin contrasts are primary (Holm over the two); the rest exploratory, among them whether the
μ-anchored arm and its twin learn at all (held-out success at the end against the start), so that a verdict on the
anchor can be read as one where training works. Whether both anchors' masks fire is read from their blocked shares
(the degenerate-arm flags)."""
SWEEP_TARGETS = ("0.02", "0.08")
"""The band sweep's two strengths beside the matched one: bands calibrated per run on step 1 to block 2% and 8% of
its A ≠ 0 tokens (DPPO-Binary-KL blocked 0.06–0.82% of step 1's under int4, 1.44% over its runs). A weaker point is
left out: matched, the three rules already learned as PG-IS did, and a pilot's 0.1% target blocked no token of a
3,322-token batch (seed 100), which the degenerate-arm rule flags."""
SWEEP_RULES = (("gspo", False, "GSPO"), ("vaco", True, "VACO"), ("trm_avg", True, "TRM-Avg"))
"""The three rules shown ahead of DPPO-Binary-KL at its strength under int4 (``matched``, ``matched_more``), with
whether calibration moves both their bands."""


def swept(preset: str, both_bands: bool, target: str) -> str:
    """The study's method of ``preset`` with its band calibrated on step 1 to block ``target`` of the tokens."""
    return f"{preset}@calibrate={target}" + (",calibrate_band=both" if both_bands else "")


SWEEP_ARMS = tuple((swept(preset, both, target), f"{label} at {float(target):.0%}")
                   for preset, both, label in SWEEP_RULES for target in SWEEP_TARGETS)
"""The ``band_sweep`` experiment's arms: each rule at the two strengths."""
SWEEP = ("strength against outcome under an int4 copy (one step per rollout; each band calibrated per run on step 1: "
         "to DPPO-Binary-KL's share, or to 2% or 8% of the A ≠ 0 tokens)")
SWEEP_CONTRASTS = (
    *(Contrast(f"{SWEEP}: {label} at DPPO-Binary-KL's strength beats it at 8% (a stronger band costs learning)",
               "the field at matched strength: strength against outcome", (matched(preset, both), "mech-int4"),
               (swept(preset, both, "0.08"), "mech-int4"), family="primary", experiment="band_sweep",
               played_before=((matched(preset, both), "mech-int4"),))
      for preset, both, label in SWEEP_RULES),
    *(Contrast(f"{SWEEP}: {label} at DPPO-Binary-KL's strength beats it at 2%",
               "the field at matched strength: strength against outcome", (matched(preset, both), "mech-int4"),
               (swept(preset, both, "0.02"), "mech-int4"), played_before=((matched(preset, both), "mech-int4"),))
      for preset, both, label in SWEEP_RULES),
    *(Contrast(f"{SWEEP}: {label} at 2% beats it at 8%", "the field at matched strength: strength against outcome",
               (swept(preset, both, "0.02"), "mech-int4"), (swept(preset, both, "0.08"), "mech-int4"))
      for preset, both, label in SWEEP_RULES),
)
"""The ``band_sweep`` experiment's claims (eight seeds), written after the ``matched`` results and before its runs:
for the three rules ahead of DPPO-Binary-KL at its strength, whether a stronger band costs learning. Primary (Holm
over the three): each at DPPO-Binary-KL's strength (the ``matched`` runs, played before) against 8%; exploratory:
against 2%, and 2% against 8%. The strength each arm ends up blocking over its run is reported beside its verdicts
(a band set on step 1 drifts)."""
PLACEBO = "the mechanism's cell-matched placebo (fp32 sampler, one step per rollout)"
PLACEBO_CONTRASTS = (
    Contrast(f"{PLACEBO}: PG-IS beats blocking a random set of Â < 0 tokens at the rate int4's mask blocked its A<0 "
             "half in each μ bucket (the mechanism predicts not: equivalent)", "mechanism: the A<0 half's placebo",
             ("pg_is", "v5-fp32"), ("placebo_neg", "v5-fp32"), family="primary", experiment="placebo"),
    Contrast(f"{PLACEBO}: PG-IS beats blocking a random set of Â > 0 tokens at the rate int4's mask blocked its A>0 "
             "half in each μ bucket (the mechanism predicts not: equivalent)", "mechanism: the A>0 half's placebo",
             ("pg_is", "v5-fp32"), ("placebo_pos", "v5-fp32"), family="primary", experiment="placebo"),
    Contrast(f"{PLACEBO}: the A>0 half's placebo beats the A<0 half's", "mechanism: the halves' placebos",
             ("placebo_pos", "v5-fp32"), ("placebo_neg", "v5-fp32")),
)
"""The ``placebo`` experiment's claims (eight seeds), written before its runs. The noise control (``mech-noise``)
blocked tokens of the A>0 half only; the placebo blocks each half apart, with an fp32 sampler (no engine error),
a uniformly random set of the tokens of the half's sign of Â in each μ bucket, as many as int4's mask blocked there
on average over its runs (``studies.cpu.placebo.PLACEBO_RATES``: 1.035% of the A ≠ 0 tokens for the A<0 half, 0.410%
for the A>0 half). If blocking that many tokens of a half costs learning whichever tokens they are, PG-IS beats its
placebo; the mechanism's reading (the cost lies in which tokens int4's mask blocks) predicts equivalence. Primary
(Holm over the two): each placebo against PG-IS, played beside them; exploratory: the placebos against each other.
The placebo blocks at a constant rate, where int4's mask blocked fewer tokens early in a run and more later."""

SIGN = ("in PG-IS runs under an int4 copy (one step per rollout), Â < 0 leans further toward the tokens the copy "
        "over-weights late in the run than early: the sign difference (share of Â < 0 among the tokens over δ where "
        "μ > π, minus where μ < π) is larger over steps 26–50 than over steps 1–10")
SIGN_CONTRASTS = (
    Contrast(f"{SIGN} (the mechanism experiment's runs, seeds 0–7, read by stretch before this claim was written)",
             "mechanism: the sign difference builds up", ("pg_is", "mech-int4"), ("pg_is", "mech-int4"),
             "sign_gap_late", SHARE_MARGIN, right_metric="sign_gap_early", played_before=(("pg_is", "mech-int4"),)),
    Contrast(f"{SIGN} (new seeds 8–15)", "mechanism: the sign difference builds up", ("pg_is", "v5-int4"),
             ("pg_is", "v5-int4"), "sign_gap_late", SHARE_MARGIN, family="primary", experiment="signs",
             right_metric="sign_gap_early"),
    Contrast("in PG-IS runs under an int4 copy (one step per rollout, new seeds 8–15), among tokens whose binary KL "
             "to μ exceeds δ 0.05, more have Â < 0 where the copy over-weights the token (μ > π) than where it "
             "under-weights it, pooled over the run", "mechanism: the sign difference, pooled", ("pg_is", "v5-int4"),
             ("pg_is", "v5-int4"), "over_delta_neg_share_mu_above", SHARE_MARGIN, family="primary",
             experiment="signs", right_metric="over_delta_neg_share_mu_below"),
)
"""The sign claim over time, written down as a claim: per PG-IS run under int4, the sign difference over steps 26–50
against over steps 1–10, paired within each run (margin :data:`SHARE_MARGIN`). On the ``mechanism`` experiment's
runs it is exploratory: they were read by stretch before it was written (the page printed +0.035 early, +0.133
late). The ``signs`` experiment plays PG-IS under the same flags and policy (``v5-int4``) on seeds 8–15, new data on
which the claim over time and the pooled sign claim (the ``mechanism`` experiment's first, replicated) are primary,
Holm over the two."""

HELD_LIKE = "calibrate_like=dppo_binary_kl,calibrate_every=1"
"""How a v6 arm holds its band (``--tr-calibrate-like dppo_binary_kl --tr-calibrate-every 1``): at every step, on
that step's batch, to block as many A ≠ 0 tokens as DPPO-Binary-KL's mask blocks there. Under the int4 copy at one
step per rollout π_θ ≠ μ before the update, so the band is set before it and holds that step exactly; under
staleness alone (an fp32 copy, four quarter-batch steps) π_θ = μ before the update, so the band is set on the
update's own loss calls and holds from the next step."""


def held(preset: str, both_bands: bool = False) -> str:
    """The study's method of ``preset`` with its band held at DPPO-Binary-KL's strength at every step
    (:data:`HELD_LIKE`); ``both_bands`` as in :func:`matched`."""
    return f"{preset}@{HELD_LIKE}" + (",calibrate_band=both" if both_bands else "")


HELD_RULES = (("gspo", False, "GSPO"), ("vaco", True, "VACO"), ("dppo_binary_tv", False, "DPPO-Binary-TV"),
              ("grpo_clip_higher", False, "GRPO-ClipHigher"), ("ipo", False, "the symmetric band (prime-rl's IPO)"),
              ("trm_max", True, "TRM-Max"), ("trm_avg", True, "TRM-Avg"),
              ("opsm", True, "DeepSeek-V3.2's off-policy sequence mask"))
"""v6's held arms: the eight rules of v5's matched experiments, with the same bands moved."""
HELD_ARMS = tuple((held(preset, both), label) for preset, both, label in HELD_RULES)
HELD = ("with its band held at DPPO-Binary-KL's strength at every step under an int4 copy (one step per rollout; the "
        "band set on each step's batch, before its update, to block as many tokens as DPPO-Binary-KL's mask does "
        "there)")
HELD_STALE = ("with its band held at DPPO-Binary-KL's strength under staleness (four quarter-batch steps per rollout, "
              "fp32 copy; the band set on each step's update to block as many tokens as DPPO-Binary-KL's mask does "
              "there, and held from the next step)")
HELD_SOURCE = "the field at held strength"


def held_contrasts(experiment: str, condition: str, setting: str) -> tuple[Contrast, ...]:
    """A held experiment's claims under ``condition``: each held arm against DPPO-Binary-KL, Holm over the eight as
    one family (``experiment``), and against PG-IS, Holm over the eight as another (``experiment``_pg_is): each
    question asked of eight rules against one reference. Both references are an earlier experiment's runs of the
    condition, declared as played before the claims."""
    against = (("dppo_binary_kl", "DPPO-Binary-KL", experiment), ("pg_is", "PG-IS", f"{experiment}_pg_is"))
    return tuple(Contrast(f"{setting}: {label} beats {name}", HELD_SOURCE, (method, condition), (reference, condition),
                          family="primary", experiment=family, played_before=((reference, condition),))
                 for reference, name, family in against for method, label in HELD_ARMS)


HELD_CONTRASTS = held_contrasts("held", "mech-int4", HELD)
"""The ``held`` experiment's claims (eight seeds), written after v5's results and before its runs: under the int4
condition of ``matched``, each rule with its band held at DPPO-Binary-KL's strength at every step against
DPPO-Binary-KL (Holm over the eight) and against PG-IS (Holm over the eight), on the ``mechanism`` experiment's
reference runs (same policy, seeds and flags, played before). v5 set each band once, on step 1, and a rule's share
over the run then ranged from 0.24× to 3.8× DPPO-Binary-KL's per seed: held, the comparison is of which tokens each
rule blocks at every step. The report gives each arm's share over the run beside DPPO-Binary-KL's; the design asks
it to be within 1.25× of it."""
HELD_STALE_CONTRASTS = held_contrasts("held_stale", "field-mb4", HELD_STALE)
"""The ``held_stale`` experiment's claims (eight seeds), written with ``held``'s and for the same reasons: the eight
held rules under ``frontier_stale``'s condition, against its DPPO-Binary-KL and PG-IS runs (played before). There
each band lags one step (π_θ = μ before the update)."""

PLACEBO_CELLS = ("the mechanism's placebo in int4's own cells (int4 copy, one step per rollout: random tokens of "
                 "int4's two cells, Â < 0 where μ > π and Â > 0 where μ < π, at the rates its mask blocked each, per "
                 "μ bucket; the control blocks the other two cells at the same rates)")
PLACEBO_CELLS_CONTRASTS = (
    Contrast(f"{PLACEBO_CELLS}: PG-IS beats the placebo in int4's cells (the mechanism predicts not: whichever "
             "tokens of those cells are blocked at that rate, learning does not suffer)", "mechanism: the cells' "
             "placebo", ("pg_is", "mech-int4"), ("placebo_cells", "mech-int4"), family="primary",
             experiment="placebo_cells", played_before=(("pg_is", "mech-int4"),)),
    Contrast(f"{PLACEBO_CELLS}: the placebo in int4's cells beats DPPO-Binary-KL (the tokens its mask picks in those "
             "cells cost more than random ones)", "mechanism: the cells' placebo", ("placebo_cells", "mech-int4"),
             ("dppo_binary_kl", "mech-int4"), family="primary", experiment="placebo_cells",
             played_before=(("dppo_binary_kl", "mech-int4"),)),
    Contrast(f"{PLACEBO_CELLS}: the placebo in the other cells beats the placebo in int4's cells (the cells "
             "themselves matter)", "mechanism: the cells' control", ("placebo_cells_other", "mech-int4"),
             ("placebo_cells", "mech-int4"), family="primary", experiment="placebo_cells"),
    Contrast(f"{PLACEBO_CELLS}: PG-IS beats the placebo in the other cells", "mechanism: the cells' control",
             ("pg_is", "mech-int4"), ("placebo_cells_other", "mech-int4"), played_before=(("pg_is", "mech-int4"),)),
)
"""The ``placebo_cells`` experiment's claims (eight seeds), written before its runs. v5's placebo matched the sign of
Â, the μ bucket and the rate, but not the side of μ − π, with an fp32 sampler; this one blocks random tokens in
int4's own cells under the int4 copy itself, at the rates int4's mask blocked each cell per μ bucket
(``studies.cpu.placebo.PLACEBO_RATES``), and its control blocks the other two cells at the same rates. Primary (Holm
over the three): PG-IS against the cells' placebo (the mechanism predicts equivalence), the placebo against the mask
(predicted to hold: the mask's tokens cost more than random ones of their cells), and the control against the
placebo (does the cell matter). Exploratory: PG-IS against the control. The references are the ``mechanism``
experiment's runs of the condition, played before."""

HALVES = ("Takeaway 3 where the mask helps (staleness: fp32 copy, four quarter-batch steps per rollout, where "
          "DPPO-Binary-KL's mask kept learning that PG-IS lost)")
HALVES_CONTRASTS = (
    Contrast(f"{HALVES}: the mask's A<0 half alone (blocks Â < 0 where μ > π) beats PG-IS", "Takeaway 3",
             ("dppo_binary_kl_neg", "field-mb4"), ("pg_is", "field-mb4"), family="primary", experiment="halves",
             played_before=(("pg_is", "field-mb4"),)),
    Contrast(f"{HALVES}: the mask's A<0 half alone beats its A>0 half alone", "Takeaway 3",
             ("dppo_binary_kl_neg", "field-mb4"), ("dppo_binary_kl_pos", "field-mb4"), family="primary",
             experiment="halves"),
    Contrast(f"{HALVES}: the whole mask beats its A>0 half alone", "Takeaway 3",
             ("dppo_binary_kl", "field-mb4"), ("dppo_binary_kl_pos", "field-mb4"), family="primary",
             experiment="halves", played_before=(("dppo_binary_kl", "field-mb4"),)),
    Contrast(f"{HALVES}: the whole mask beats its A<0 half alone (the paper: comparable)", "Takeaway 3",
             ("dppo_binary_kl", "field-mb4"), ("dppo_binary_kl_neg", "field-mb4"),
             played_before=(("dppo_binary_kl", "field-mb4"),)),
    Contrast(f"{HALVES}: the mask's A>0 half alone beats PG-IS", "Takeaway 3",
             ("dppo_binary_kl_pos", "field-mb4"), ("pg_is", "field-mb4"), played_before=(("pg_is", "field-mb4"),)),
)
"""The ``halves`` experiment's claims (eight seeds), written before its runs: Takeaway 3 (the instability comes from
updates on negative samples) asked where the mask binds and helps, under ``frontier_stale``'s condition (its
DPPO-Binary-KL runs' mean training success 0.27 against PG-IS's 0.05, played before). Primary (Holm over the three):
the A<0 half alone against PG-IS and against the A>0 half, and the whole mask against the A>0 half (Takeaway 3
predicts all three hold). Exploratory: the whole mask against the A<0 half (the paper finds them comparable:
equivalence), and the A>0 half against PG-IS."""

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
    # Added before the runs of the v5 experiments ``matched``, ``matched_more``, ``matched_stale``, ``placebo`` and
    # ``signs`` (eight seeds; primary claims Holm-corrected within each experiment), with the sign claim over time on
    # the mechanism experiment's runs (exploratory: read before it was written).
    *MATCHED_CONTRASTS,
    *MATCHED_MORE_CONTRASTS,
    *MATCHED_STALE_CONTRASTS,
    *PLACEBO_CONTRASTS,
    *SIGN_CONTRASTS,
    # Added before the runs of the ``regime_lr`` experiment (eight seeds; the two twin contrasts are primary,
    # Holm-corrected together): Takeaway 2 in its regime at lr 1e-4, where training should survive.
    *REGIME_LR_CONTRASTS,
    # Added before the runs of the ``band_sweep`` experiment (eight seeds; its three claims against 8% are primary,
    # Holm-corrected together), after a two-step pilot of its targets on seed 100.
    *SWEEP_CONTRASTS,
    # Added before the runs of the v6 experiments ``held``, ``held_stale``, ``placebo_cells`` and ``halves`` (eight
    # seeds; primary claims Holm-corrected within each family: the held rules against each reference, the cells'
    # placebo, the halves).
    *HELD_CONTRASTS,
    *HELD_STALE_CONTRASTS,
    *PLACEBO_CELLS_CONTRASTS,
    *HALVES_CONTRASTS,
)
"""The study's claims, fixed before its runs: exploratory, or primary (Holm-corrected with the other primary claims
of their experiment, and scored as exploratory with fewer than :data:`PRIMARY_MIN_PAIRS` paired seeds). ``auc``:
mean training success over all steps. Each is scored by :func:`contrast_table`: it holds when the one-sided t-test
of ``left − right > margin`` rejects at 0.025 (for one claim alone: the paired 95% t-interval lies above the margin),
is refuted when that of ``left − right < −margin`` does, and the arms are equivalent when the two one-sided tests of
``|left − right| < margin`` do; else inconclusive."""

