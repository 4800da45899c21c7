r"""The trust region of every method in the paper, as one per-token policy loss.

All methods share the unified gradient (eq:unified_grad, app:sanity_test_details):

$$
\nabla L = \mathbb{E}_{\mu}\Big[\sum_t M_t \, w_t \, A_t \, \nabla \log \pi_\theta(a_t \mid s_t)\Big], \qquad
w_t = \min(r_t, C), \qquad
r_t = \frac{\pi_\theta(a_t \mid s_t)}{\mu(a_t \mid s_t)}
$$

and differ only in the mask ``M_t`` (which updates are blocked) and the importance-sampling cap ``C``. A
:class:`TrustRegion` names one such rule; :func:`policy_loss` evaluates it on a batch of tokens.

The mask is anchored on the behavior policy μ that sampled the tokens (sec:correct_ancher_for_truct_region); the
``*_recompute`` and ``minirl*`` presets anchor it on the recomputed rollout weights π_θ' instead, as ablations. The IS
weight ``min(r_t, C)`` is against μ.

The fixes for training–inference mismatch that other frameworks ship are presets of the same loss (``tis``,
``seq_tis``, ``icepop``, ``seq_geo_mask``, ``decoupled_ppo``, ``dppo_binary_tv_kl``): they multiply M_t by a mask on
the training engine's own ratio ρ_t = π_θ'(a_t)/μ(a_t) (per token, or per response through its geometric mean),
replace w_t by the *decoupled* weight (π_θ/π_θ')·min(ρ_t, C) of their PPO-on-π_θ' losses, and may add a penalty
τ·log²(π_θ/μ) per token (its gradient 2τ·log(π_θ/μ)·∇log π_θ adds to the one above). Each preset's ``source`` names
the file and defaults it follows.

Three later methods are presets too. ``drpo`` (DRPO) keeps every token (M_t = 1) and adds a smooth quadratic
regularizer on the policy shift, |A_t|·μ·(r_t − 1)²/(2δ) = |A_t|·(π_θ − μ)²/(2δ·μ); ``cppo`` and ``cppo_binary_tv``
(CPPO) mask as DPPO does but against a position-weighted threshold and a cumulative budget over each response's
prefix; ``m2po`` (M2PO) masks the tokens with the largest (log r_t)² until the batch's second moment is within τ_M2.
The masks of CPPO and M2PO read more than their own token (``couples_tokens``).

The field after DPPO is presets too: ``ipo`` (prime-rl's symmetric band |π − μ| ≤ δ, whatever A), ``trm_max`` and
``trm_avg`` (Trust Region Masking: a whole response masked when its max k2 or mean k3 to μ exceeds δ), ``opsm``
(DeepSeek-V3.2's off-policy sequence mask), ``vaco`` (a directional sequence-level binary TV of π_θ' to μ), and three
that set w_t themselves (a rule's ``weight``): ``gspo`` (the sequence ratio, clipped), ``sapo`` (a soft gate) and
``minpro`` (the minimum token ratio over the prefix). A row of the loss is one turn, so their sequences are turns.

The modules, each one concept:

- :mod:`~dppo_oat.trust_region.config`: :class:`TrustRegion` and its checks, the registry of its fields.
- :mod:`~dppo_oat.trust_region.presets`: :data:`PRESETS`, every method as data with its source.
- :mod:`~dppo_oat.trust_region.registry`: :class:`Rule`, :data:`RULE_TABLE`, :func:`register_rule` (a decorator,
  as verl's ``@register_policy_loss``), what a rule reads (:class:`MaskInputs`, :class:`TopK`) and the divergences
  and thresholds it may name.
- :mod:`~dppo_oat.trust_region.rules`: one function per rule, with the weight, loss term and metrics it declares.
- :mod:`~dppo_oat.trust_region.masks` and :mod:`~dppo_oat.trust_region.weights`: M_t and w_t as pure tensor
  functions, as each source writes them.
- :mod:`~dppo_oat.trust_region.band_search`: :func:`calibrate`, a band set to block a target fraction of a batch.
- :mod:`~dppo_oat.trust_region.held_band`: :class:`HeldBand`, that band set again every N steps of a run.
- :mod:`~dppo_oat.trust_region.loss`: :func:`policy_loss` and the IS weight it builds.
  :mod:`~dppo_oat.trust_region.metrics`: the batch
  statistics, the shadow masks and the mismatch diagnostics. :mod:`~dppo_oat.trust_region.reductions`: masked means,
  sums and maxima.

Every name below is importable from ``dppo_oat.trust_region`` itself.
"""

from __future__ import annotations

from dppo_oat.trust_region.band_search import (
    BAND_RANGE,
    BAND_RTOL,
    SOFT_BLOCK_LEVEL,
    UNITS,
    Band,
    CalibrationBatch,
    CalibrationReport,
    UnmovedBatch,
    band_choices,
    band_of,
    blocked_fraction,
    calibrate,
    check_batch_serves,
)
from dppo_oat.trust_region.config import (
    ANCHORS,
    CHOICE_FIELDS,
    INTEGER_FIELDS,
    IS_WEIGHTS,
    MASK_SIDES,
    MISMATCH_MASKS,
    NUMBER_FIELDS,
    REAL_FIELDS,
    RELAX_MODES,
    TrustRegion,
    numeric_fields_read,
)
from dppo_oat.trust_region.held_band import HeldBand
from dppo_oat.trust_region.loss import (
    PolicyLossOutput,
    importance_weight,
    mask_inputs,
    policy_loss,
    rule_divergence,
    token_weight,
    trust_region_keep,
)
from dppo_oat.trust_region.masks import (
    GSPO_LOG_RATIO_CAP,
    MAX_LOG_RATIO,
    PREFIX_BUDGET_CEILING,
    PREFIX_BUDGET_QUANTILE,
    ROLLOUT_CORR_LOG_BOUND,
    band_keep,
    directional_sequence_keep,
    divergence_keep,
    gspo_keep,
    m2po_trust_region,
    mismatch_keep,
    negative_keep,
    off_policy_sequence_keep,
    position_weights,
    prefix_budget,
    prefix_budget_keep,
    prefix_thresholds,
    ratio_keep,
    relaxed_clip_range,
    second_moment_keep,
    sequence_statistic_keep,
    symmetric_band_keep,
)
from dppo_oat.trust_region.metrics import (
    BAD_UPDATE_THRESHOLD,
    MU_BUCKETS,
    OVER_DELTA_KL,
    SHADOW_CLIP_RANGES,
    SHADOW_MISMATCH_PRESETS,
    SIGN_CELLS,
    effective_sample_size,
    mismatch_diagnostics,
    shadow_mask_stats,
    shadow_mismatch_bands,
    sign_cell_stats,
    trust_region_metrics,
)
from dppo_oat.trust_region.presets import PRESETS, Preset
from dppo_oat.trust_region.reductions import (
    fraction,
    masked_max,
    masked_mean,
    masked_std,
    row_max,
    row_mean,
    row_sum,
    sum_before,
)
from dppo_oat.trust_region.registry import (
    DIVERGENCES,
    FIELD_SYMBOLS,
    LOGPROB_TOLERANCE,
    RULE_TABLE,
    THRESHOLDS,
    Divergence,
    MaskInputs,
    Rule,
    TopK,
    finite_tokens,
    k2_divergence,
    k3_divergence,
    register_rule,
)
from dppo_oat.trust_region.rules import keep_all  # importing the rules registers them in RULE_TABLE
from dppo_oat.trust_region.weights import (
    drpo_regularizer,
    drpo_weight,
    kl_penalty,
    prefix_min_log_ratio,
    sapo_gate_slope,
)

__all__ = [
    # the config and the presets
    "ANCHORS", "CHOICE_FIELDS", "FIELD_SYMBOLS", "INTEGER_FIELDS", "IS_WEIGHTS", "MASK_SIDES", "MISMATCH_MASKS",
    "NUMBER_FIELDS", "PRESETS", "REAL_FIELDS", "RELAX_MODES", "Preset", "TrustRegion", "numeric_fields_read",
    # band calibration
    "BAND_RANGE", "BAND_RTOL", "SOFT_BLOCK_LEVEL", "UNITS", "Band", "CalibrationBatch", "CalibrationReport",
    "HeldBand", "UnmovedBatch", "band_choices", "band_of", "blocked_fraction", "calibrate", "check_batch_serves",
    # the rule registry and the rules
    "DIVERGENCES", "RULE_TABLE", "THRESHOLDS", "Divergence", "MaskInputs", "Rule", "k2_divergence", "k3_divergence",
    "keep_all", "register_rule",
    # the loss
    "LOGPROB_TOLERANCE", "PolicyLossOutput", "TopK", "finite_tokens", "mask_inputs", "policy_loss", "rule_divergence",
    "token_weight", "trust_region_keep",
    # masks and weights
    "GSPO_LOG_RATIO_CAP", "MAX_LOG_RATIO", "PREFIX_BUDGET_CEILING", "PREFIX_BUDGET_QUANTILE", "ROLLOUT_CORR_LOG_BOUND",
    "band_keep", "directional_sequence_keep", "divergence_keep", "drpo_regularizer", "drpo_weight", "gspo_keep",
    "importance_weight", "kl_penalty", "m2po_trust_region", "mismatch_keep", "negative_keep",
    "off_policy_sequence_keep", "position_weights", "prefix_budget", "prefix_budget_keep", "prefix_min_log_ratio",
    "prefix_thresholds", "ratio_keep", "relaxed_clip_range", "sapo_gate_slope", "second_moment_keep",
    "sequence_statistic_keep", "symmetric_band_keep",
    # metrics and reductions
    "BAD_UPDATE_THRESHOLD", "MU_BUCKETS", "OVER_DELTA_KL", "SHADOW_CLIP_RANGES", "SHADOW_MISMATCH_PRESETS",
    "SIGN_CELLS", "effective_sample_size", "fraction", "masked_max", "masked_mean", "masked_std",
    "mismatch_diagnostics", "row_max", "row_mean", "row_sum", "shadow_mask_stats", "shadow_mismatch_bands",
    "sign_cell_stats", "sum_before", "trust_region_metrics",
]
