"""The rules: one function per mask M_t, registered with what it declares (:func:`register_rule`), beside the weight,
loss term and metrics it names.

Each function takes the batch's :class:`~dppo_oat.trust_region.registry.MaskInputs` ``x`` and the trust region
``tr`` and returns M_t (True: the token's update is kept); the loss multiplies it by the response tokens and, when
the trust region has one, the mismatch mask. A top-K rule and its binary twin share one function, registered under
both names by stacked decorators (the twin first).
"""

from __future__ import annotations

import torch

from dppo_oat.trust_region.config import TrustRegion
from dppo_oat.trust_region.masks import (
    GSPO_LOG_RATIO_CAP,
    MAX_LOG_RATIO,
    ROLLOUT_CORR_LOG_BOUND,
    directional_sequence_keep,
    divergence_keep,
    gspo_keep,
    m2po_trust_region,
    negative_keep,
    off_policy_sequence_keep,
    prefix_budget_keep,
    prefix_thresholds,
    ratio_keep,
    relaxed_clip_range,
    second_moment_keep,
    sequence_statistic_keep,
    symmetric_band_keep,
)
from dppo_oat.trust_region.reductions import fraction, masked_max, masked_mean, row_mean
from dppo_oat.trust_region.registry import RULE_TABLE, MaskInputs, register_rule
from dppo_oat.trust_region.weights import drpo_regularizer, drpo_weight, prefix_min_log_ratio, sapo_gate_slope

Metrics = dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------- the paper's rules


@register_rule("none", divergence="ratio")
def keep_all(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """PG-IS and CISPO: M_t = 1 (the IS weight min(r, C) alone bounds the update)."""
    return torch.ones_like(x.logp, dtype=torch.bool)


@register_rule("ratio", divergence="ratio", threshold="clip_range")
def ppo_clip(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """PPO's clip (eq:ppo-clip as a mask, :func:`~dppo_oat.trust_region.masks.ratio_keep`) on r = π_θ/anchor,
    relaxed for μ < α in the α study (:func:`~dppo_oat.trust_region.masks.relaxed_clip_range`)."""
    clip_range = relaxed_clip_range(x.behavior_logp.exp(), tr.eps_low, tr.eps_high, tr.alpha, tr.relax)
    return ratio_keep(x.ratio, x.advantages, *clip_range)


@register_rule("topk_kl", divergence="topk_kl", threshold="delta", reads_mask_side=True,  # eq:topk_kl
               binary_twin="binary_kl")
@register_rule("topk_tv", divergence="topk_tv", threshold="delta", reads_mask_side=True,  # eq:topk_tv
               binary_twin="binary_tv")
@register_rule("binary_kl", divergence="binary_kl", threshold="delta", reads_mask_side=True)  # eq:binary_kl
@register_rule("binary_tv", divergence="binary_tv", threshold="delta", reads_mask_side=True)  # eq:binary_tv
def dppo_mask(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DPPO (eq:dppo_obj, :func:`~dppo_oat.trust_region.masks.divergence_keep`): block A>0 & r>1 & D>δ and
    A<0 & r<1 & D>δ, D the binary or top-K TV or KL; ``mask_side`` keeps one half alone."""
    return divergence_keep(x.ratio, x.advantages, x.divergence, tr.delta, tr.mask_side)


@register_rule("mask_negative", divergence="prob_drop", threshold="delta")
def mask_negative(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """Takeaway 3's minimal mask (sec:stability, :func:`~dppo_oat.trust_region.masks.negative_keep`): block
    A<0 & anchor(a_t) − π(a_t) ≥ δ."""
    return negative_keep(x.anchor_logp.exp(), x.logp.exp(), x.advantages, tr.delta)


# --------------------------------------------------------------------------------------------- DRPO, CPPO, M2PO


def drpo_term(logp: torch.Tensor, x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DRPO's regularizer (:func:`~dppo_oat.trust_region.weights.drpo_regularizer`) from log π_θ with its gradient."""
    return drpo_regularizer(logp, x.anchor_logp, x.advantages, x.response, tr.delta)


def drpo_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> Metrics:
    """ω_t of :func:`~dppo_oat.trust_region.weights.drpo_weight` over the A ≠ 0 tokens (``drpo/weight_mean``,
    ``drpo/weight_min``, and ``drpo/corrective_fraction``, ω_t < 0: beyond the boundary) and the regularizer's mean
    per response token."""
    active = x.response & (x.advantages != 0)
    weight = drpo_weight(x.logp.exp(), x.anchor_logp.exp(), x.advantages, tr.delta)
    return {
        "drpo/weight_mean": masked_mean(weight, active),
        "drpo/weight_min": -masked_max(-weight, active),
        "drpo/corrective_fraction": fraction(weight < 0, active),
        "drpo/regularizer_mean": masked_mean(drpo_term(x.logp, x, tr), x.response),
    }


@register_rule("drpo", divergence="binary_tv", reads=("delta",), loss_term=drpo_term, metrics=drpo_metrics)
def drpo(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DRPO (arXiv 2606.09821): M_t = 1; its trust region is the regularizer :func:`drpo_term` adds to the loss."""
    return keep_all(x, tr)


def cppo_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> Metrics:
    """``cppo/budget_mask_fraction``, the A ≠ 0 tokens the prefix budget blocked although Z_t ≤ δ, and the mean
    per-response budget δ_b^seq."""
    z, _, budget = prefix_thresholds(x.divergence, x.response, tr.delta, tr.w_min, tr.delta_b)
    return {
        "cppo/budget_mask_fraction": fraction(~keep & (z <= tr.delta), x.response & (x.advantages != 0)),
        "cppo/delta_b_mean": masked_mean(budget, x.response.any(-1, keepdim=True)),
    }


@register_rule("cppo_topk_tv", divergence="topk_tv", threshold="delta", reads=("w_min", "delta_b"),
               metrics=cppo_metrics, couples_tokens=True, binary_twin="cppo_binary_tv")
@register_rule("cppo_binary_tv", divergence="binary_tv", threshold="delta", reads=("w_min", "delta_b"),
               metrics=cppo_metrics, couples_tokens=True)
def cppo_mask(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """CPPO (arXiv 2606.10968, :func:`~dppo_oat.trust_region.masks.prefix_budget_keep`): DPPO's mask on the
    position-weighted D_t against the response's prefix budget."""
    return prefix_budget_keep(x.ratio, x.advantages, x.divergence, x.response, tr.delta, tr.w_min, tr.delta_b)


def m2po_metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> Metrics:
    """M̂2 over the trust-region tokens before and after the mask (Algorithm 1's quantity; ``divergence/mean`` is
    eq. 4's over all tokens), the masked fraction of the response tokens and the fraction that are trust-region
    tokens."""
    trust = m2po_trust_region(x.logp - x.anchor_logp, x.advantages, x.response)
    return {
        "m2po/m2_before": masked_mean(x.divergence, trust),
        "m2po/m2_after": masked_mean(x.divergence, trust & keep),
        "m2po/masked_fraction": fraction(~keep, x.response),
        "m2po/trust_region_fraction": fraction(trust, x.response),
    }


@register_rule("m2po", divergence="log_ratio_sq", threshold="tau_m2", metrics=m2po_metrics, couples_tokens=True,
               reads_batch=True)
def m2po(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """M2PO (arXiv 2510.01161, :func:`~dppo_oat.trust_region.masks.second_moment_keep`): the batch's trust-region
    tokens of largest (log r)² masked until their mean is ≤ τ_M2."""
    return second_moment_keep(x.logp - x.anchor_logp, x.advantages, x.response, tr.tau_m2)


# --------------------------------------------------------------------------------------------- the field after DPPO
# Sequence masks, the symmetric band, soft gates and sequence weights; a row of the loss (a sequence) is one turn.


def sequence_mask_metrics(prefix: str):
    """Metrics of a sequence-level mask: ``<prefix>/seq_masked_fraction``, the rows with a response token whose every
    A ≠ 0 token the rule blocked, and ``<prefix>/masked_fraction`` over the A ≠ 0 tokens."""

    def metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> Metrics:
        active = x.response & (x.advantages != 0)
        rows = active.any(-1)
        whole = rows & ~(keep & active).any(-1)
        return {f"{prefix}/seq_masked_fraction": fraction(whole, rows),
                f"{prefix}/masked_fraction": fraction(~keep, active)}

    return metrics


def own_weight_metrics(prefix: str):
    """``<prefix>/weight_mean`` and ``<prefix>/weight_min`` of the rule's own w_t over the A ≠ 0 tokens."""

    def metrics(x: MaskInputs, keep: torch.Tensor, tr: TrustRegion) -> Metrics:
        active = x.response & (x.advantages != 0)
        weight = RULE_TABLE[tr.rule].weight(x, tr)
        return {f"{prefix}/weight_mean": masked_mean(weight, active),
                f"{prefix}/weight_min": -masked_max(-weight, active)}

    return metrics


@register_rule("ipo", divergence="binary_tv", threshold="delta")
def ipo(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """IPO, prime-rl's symmetric band (:func:`~dppo_oat.trust_region.masks.symmetric_band_keep`): |π − μ| ≤ δ
    whatever A."""
    return symmetric_band_keep(x.divergence, tr.delta)


@register_rule("trm_max", divergence="k2", threshold="clip_range", reads=("delta",),
               metrics=sequence_mask_metrics("trm"), couples_tokens=True)
def trm_max(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """TRM-Max: PPO's clip (:func:`ppo_clip`) and the row's max k2 ≤ δ
    (:func:`~dppo_oat.trust_region.masks.sequence_statistic_keep`)."""
    return ppo_clip(x, tr) & sequence_statistic_keep(x.divergence, x.response, tr.delta, "max")


@register_rule("trm_avg", divergence="k3", threshold="clip_range", reads=("delta",),
               metrics=sequence_mask_metrics("trm"), couples_tokens=True)
def trm_avg(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """TRM-Avg: PPO's clip (:func:`ppo_clip`) and the row's mean k3 ≤ δ
    (:func:`~dppo_oat.trust_region.masks.sequence_statistic_keep`)."""
    return ppo_clip(x, tr) & sequence_statistic_keep(x.divergence, x.response, tr.delta, "mean")


@register_rule("opsm", divergence="ratio", threshold="clip_range", reads=("delta",),
               metrics=sequence_mask_metrics("opsm"), couples_tokens=True)
def opsm(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """DeepSeek-V3.2: PPO's clip (:func:`ppo_clip`) and the off-policy sequence mask on μ
    (:func:`~dppo_oat.trust_region.masks.off_policy_sequence_keep`)."""
    log_ratio = x.logp - x.behavior_logp
    return ppo_clip(x, tr) & off_policy_sequence_keep(log_ratio, x.advantages, x.response, tr.delta)


@register_rule("vaco", divergence="ratio", threshold="clip_range", reads=("delta",),
               metrics=sequence_mask_metrics("vaco"), couples_tokens=True, needs_recompute=True)
def vaco(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """VACO: PPO's clip on π_θ/π_θ' (:func:`ppo_clip`) and
    :func:`~dppo_oat.trust_region.masks.directional_sequence_keep` on π_θ' against μ."""
    directional = directional_sequence_keep(x.anchor_logp, x.behavior_logp, x.advantages, x.response, tr.delta)
    return ppo_clip(x, tr) & directional


def gspo_log_ratio(x: MaskInputs) -> torch.Tensor:
    """log s_i = mean_t log(π_θ/anchor) over the row's response tokens, ``[B, 1]`` (GSPO's sequence ratio)."""
    return row_mean(x.logp - x.anchor_logp, x.response)


def gspo_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """GSPO's w_t = s_i (the gradient of s_{i,t} = sg[s_i]·π_θ/sg[π_θ] is s_i·∇log π_θ(a_t))."""
    return gspo_log_ratio(x).clamp(max=GSPO_LOG_RATIO_CAP).exp().expand_as(x.logp)


@register_rule("gspo", divergence="ratio", threshold="clip_range", weight=gspo_weight,
               metrics=own_weight_metrics("gspo"), couples_tokens=True)
def gspo(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """GSPO (:func:`~dppo_oat.trust_region.masks.gspo_keep`): PPO's clip on the row's sequence ratio s_i."""
    return gspo_keep(gspo_log_ratio(x), x.advantages, tr.eps_low, tr.eps_high)


def sapo_ratio(x: MaskInputs) -> torch.Tensor:
    """r_t as SAPO's w_t reads it: log r clamped at ±:data:`~dppo_oat.trust_region.masks.ROLLOUT_CORR_LOG_BOUND`."""
    return (x.logp - x.anchor_logp).clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND).exp()


def sapo_gate(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """SAPO's soft gate f'(r_t) (:func:`~dppo_oat.trust_region.weights.sapo_gate_slope`; 1 at r = 1)."""
    return sapo_gate_slope(sapo_ratio(x), x.advantages, tr.tau_pos, tr.tau_neg)


def sapo_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """SAPO's w_t = r_t·f'(r_t) (:func:`sapo_gate`)."""
    return sapo_ratio(x) * sapo_gate(x, tr)


@register_rule("sapo", divergence="ratio", reads=("tau_pos", "tau_neg"), weight=sapo_weight, soft_gate=sapo_gate,
               metrics=own_weight_metrics("sapo"))
def sapo(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """SAPO's M_t: 1 but where verl's clamp of log r at ±:data:`~dppo_oat.trust_region.masks.ROLLOUT_CORR_LOG_BOUND`
    passes no gradient; its soft gate is its w_t (:func:`sapo_weight`)."""
    return (x.logp - x.anchor_logp).abs() <= ROLLOUT_CORR_LOG_BOUND


def minpro_weight(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """MinPRO's w_t = min_{j ≤ t} r_j (:func:`~dppo_oat.trust_region.weights.prefix_min_log_ratio`)."""
    return prefix_min_log_ratio(x.logp - x.anchor_logp, x.response).clamp(max=MAX_LOG_RATIO).exp()


@register_rule("minpro", divergence="ratio", weight=minpro_weight, metrics=own_weight_metrics("minpro"),
               couples_tokens=True)
def minpro(x: MaskInputs, tr: TrustRegion) -> torch.Tensor:
    """MinPRO: M_t = 1; its trust region is its w_t, the prefix minimum of the ratio (:func:`minpro_weight`)."""
    return keep_all(x, tr)
