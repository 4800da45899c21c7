r"""The loss: :func:`policy_loss`, the per-token loss of the unified gradient (eq:unified_grad) under a
:class:`~dppo_oat.trust_region.config.TrustRegion`,

$$
\nabla L = \mathbb{E}_{\mu}\Big[\sum_t M_t \, w_t \, A_t \, \nabla \log \pi_\theta(a_t \mid s_t)\Big],
$$

M_t from the trust region's rule (and mismatch mask), w_t its IS weight or the rule's own, plus the rule's loss term
and the KL penalty; with the inputs it checks and what it returns (:class:`PolicyLossOutput`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from dppo_oat.trust_region.config import TrustRegion
from dppo_oat.trust_region.masks import MAX_LOG_RATIO, mismatch_keep
from dppo_oat.trust_region.metrics import mismatch_diagnostics, trust_region_metrics
from dppo_oat.trust_region.reductions import row_sum
from dppo_oat.trust_region.registry import (
    DIVERGENCES,
    RULE_TABLE,
    MaskInputs,
    Rule,
    TopK,
    check_logprobs_at_most_zero,
    finite_tokens,
)
from dppo_oat.trust_region.weights import kl_penalty


@dataclass
class PolicyLossOutput:
    """Per-token loss of eq:unified_grad and what the rule decided.

    ``loss`` is ``−M_t · w_t · A_t + τ · log²(π_θ/μ)`` in value (the per-token surrogate) with gradient
    ``(−M_t · w_t · A_t + 2τ · log(π_θ/μ)) · ∇ log π_θ`` (w_t = min(r_t, C) but for the decoupled weights of
    :data:`~dppo_oat.trust_region.config.IS_WEIGHTS` and the rules' own; τ = 0 but for the ``kl_tau`` presets; plus
    a rule's loss term); it is 0 off the response mask. ``keep`` is M_t: the rule's mask and, when the trust region
    has one, the mismatch mask.
    """

    loss: torch.Tensor
    keep: torch.Tensor
    divergence: torch.Tensor
    metrics: dict[str, float]


def rule_divergence(tr: TrustRegion, logp, anchor_logp, topk: TopK | None) -> torch.Tensor:
    """The D_t the rule thresholds (:data:`~dppo_oat.trust_region.registry.DIVERGENCES`)."""
    return DIVERGENCES[RULE_TABLE[tr.rule].divergence](logp, anchor_logp, topk)


def mask_inputs(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None,
                response=None) -> MaskInputs:
    """The :class:`~dppo_oat.trust_region.registry.MaskInputs` of a batch under ``tr``, its divergence D_t
    computed. All inputs detached fp32 ``[B, T]``; ``response`` (the response tokens) is required by the rules that
    couple tokens."""
    if tr.couples_tokens and response is None:
        raise ValueError(f"trust region {tr.name!r} masks a token by the others: pass the response mask")
    divergence = rule_divergence(tr, logp, anchor_logp, topk)
    response = torch.ones_like(logp, dtype=torch.bool) if response is None else response
    return MaskInputs(logp, anchor_logp, behavior_logp, advantages, response, divergence)


def trust_region_keep(tr: TrustRegion, logp, anchor_logp, behavior_logp, advantages, topk=None, response=None):
    """The mask M_t of ``tr`` and the divergence it thresholded (inputs as :func:`mask_inputs`'s)."""
    inputs = mask_inputs(tr, logp, anchor_logp, behavior_logp, advantages, topk, response)
    return RULE_TABLE[tr.rule].keep(inputs, tr), inputs.divergence


def as_trust_region(tr) -> TrustRegion:
    """``tr`` itself, or the preset it names; anything else is one ``ValueError``."""
    if isinstance(tr, str):
        return TrustRegion.preset(tr)
    if not isinstance(tr, TrustRegion):
        raise ValueError(f"tr must be a TrustRegion or a preset's name, got {type(tr).__name__}")
    return tr


RENAMED_KEYWORDS = {"mask": "response_mask"}
"""Keywords :func:`policy_loss` refuses, each with the one it takes instead (``mask`` would read as M_t, the rule's
``keep``)."""


def refuse_renamed_keywords(function):
    """``function`` with a keyword of :data:`RENAMED_KEYWORDS` refused in one line that names the new keyword."""

    @functools.wraps(function)
    def checked(*args, **kwargs):
        renamed = [name for name in kwargs if name in RENAMED_KEYWORDS]
        if renamed:
            raise TypeError(f"{function.__name__}({renamed[0]}=) is {RENAMED_KEYWORDS[renamed[0]]}=: the response "
                            "tokens (the rule's mask M_t is PolicyLossOutput.keep)")
        return function(*args, **kwargs)

    return checked


@refuse_renamed_keywords
def policy_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tr: TrustRegion | str,
    *,
    recomputed_logp: torch.Tensor | None = None,
    topk: TopK | None = None,
) -> PolicyLossOutput:
    """Per-token loss of eq:unified_grad under trust region ``tr``.

    Args:
        logp: ``[B, T]`` log π_θ(a_t|s_t), with gradient.
        behavior_logp: ``[B, T]`` log μ(a_t|s_t) from the rollout engine.
        advantages: ``[B, 1]`` (per sequence) or ``[B, T]`` (per token).
        response_mask: ``[B, T]`` bool: True on response tokens; a row is one response (one turn), the
            sequence the sequence-level rules (``decoupled_seq``, ``seq_geo``, TRM, GSPO...) aggregate over.
        tr: the trust region, or a preset's name (``"dppo_binary_tv"``: its defaults).
        recomputed_logp: ``[B, T]`` log π_θ'(a_t|s_t), needed when ``tr.needs_recompute``.
        topk: the top-K set with μ's and π_θ's log-probs, needed when ``tr.uses_topk``.
    """
    tr = as_trust_region(tr)
    _check_inputs(logp, behavior_logp, advantages, response_mask, tr, recomputed_logp, topk)
    rule = RULE_TABLE[tr.rule]
    response = response_mask.bool()
    with torch.no_grad():
        finite = finite_tokens(logp.detach(), behavior_logp, advantages, recomputed_logp, topk)
        counted = response & finite  # a token with a non-finite input is left out: no NaN reaches the loss
        lp, mu, adv, recomputed = (None if x is None else torch.where(finite, x.detach().float().expand_as(finite), 0.0)
                                   for x in (logp, behavior_logp, advantages, recomputed_logp))
        check_logprobs_at_most_zero(counted, logp=lp, behavior_logp=mu, recomputed_logp=recomputed)
        anchor = mu if tr.anchor == "behavior" else recomputed
        inputs = mask_inputs(tr, lp, anchor, mu, adv, topk, counted)
        band = mismatch_keep(tr.mismatch_mask, tr.mismatch_low, tr.mismatch_high, recomputed, mu, counted)
        keep = rule.keep(inputs, tr) & counted & band
        weight, truncated = token_weight(rule, inputs, tr, recomputed)
        coefficient = torch.where(keep, adv * weight, 0.0)
    logp32 = torch.where(finite, logp.float(), 0.0)
    # value −M·w·A; gradient −M·w·A·∇log π (exp(x − sg(x)) is 1 with gradient ∇x)
    surrogate = torch.exp(torch.where(counted, logp32 - lp, 0.0))
    loss = -coefficient * surrogate
    if rule.loss_term is not None:
        loss = loss + rule.loss_term(logp32, inputs, tr)
    if tr.kl_tau > 0:
        loss = loss + kl_penalty(logp32, mu, counted, tr.kl_tau)
    extra = mismatch_diagnostics(lp, mu, counted, weight)
    extra.update(rule.metrics(inputs, keep, tr) if rule.metrics is not None else {})
    extra["nonfinite"] = (response & ~finite).sum()
    metrics = trust_region_metrics(lp, mu, adv, counted, keep, inputs.divergence, counted & truncated, extra=extra)
    return PolicyLossOutput(loss=loss, keep=keep, divergence=inputs.divergence, metrics=metrics)


def token_weight(rule: Rule, x: MaskInputs, tr: TrustRegion, recomputed_logp) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t and where its truncation at C bit: the rule's own w_t (:attr:`~dppo_oat.trust_region.registry.Rule.weight`,
    never truncated) or the IS weight of the trust region's ``is_weight``
    (:func:`importance_weight`)."""
    if rule.weight is not None:
        return rule.weight(x, tr), torch.zeros_like(x.response)
    return importance_weight(tr, x.logp, x.behavior_logp, recomputed_logp, x.response)


def importance_weight(tr: TrustRegion, logp, behavior_logp, recomputed_logp,
                      response) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t of :data:`~dppo_oat.trust_region.config.IS_WEIGHTS` (the trust region's ``is_weight``) and where its
    truncation ``min(·, C)`` bit. All inputs detached fp32 ``[B, T]``.

    ``behavior``: min(π_θ/μ, C) (eq:unified_grad). ``decoupled_*``: (π_θ/π_θ')·min(ρ, C), ρ = π_θ'/μ per token or
    ∏_t π_θ'/μ over the response (SkyRL ``off_policy_correction_utils.compute_tis_ratio``). ``proximal``: π_θ/π_θ'.
    """
    if tr.is_weight == "behavior":
        log_truncated, log_untruncated = logp - behavior_logp, torch.zeros_like(logp)
    elif tr.is_weight == "proximal":
        log_truncated, log_untruncated = torch.zeros_like(logp), logp - recomputed_logp
    else:
        log_truncated, log_untruncated = recomputed_logp - behavior_logp, logp - recomputed_logp
        if tr.is_weight == "decoupled_seq":
            log_truncated = row_sum(log_truncated, response).expand_as(logp)
    log_cap = math.log(tr.is_cap) if math.isfinite(tr.is_cap) and tr.is_weight != "proximal" else math.inf
    log_weight = log_truncated.clamp(max=log_cap) + log_untruncated
    return log_weight.clamp(max=MAX_LOG_RATIO).exp(), log_truncated > log_cap



def _check_inputs(logp, behavior_logp, advantages, response_mask, tr, recomputed_logp, topk) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if logp.numel() == 0:
        raise ValueError(f"logp holds no token (shape {tuple(logp.shape)}): give a batch of at least one response "
                         "token")
    for name, tensor in (("behavior_logp", behavior_logp), ("response_mask", response_mask),
                         ("recomputed_logp", recomputed_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape, (logp.shape[0], 1)):
        raise ValueError(f"advantages must be [B, 1] or [B, T], got {tuple(advantages.shape)}")
    if tr.needs_recompute and recomputed_logp is None:
        raise ValueError(f"trust region {tr.name!r} reads the recomputed π_θ': pass recomputed_logp")
    if tr.uses_topk:
        if topk is None:
            raise ValueError(f"trust region {tr.name!r} needs the top-K set: pass topk=TopK(...)")
        if topk.ids.shape != (*logp.shape, tr.k + 1):
            raise ValueError(f"topk is {tuple(topk.ids.shape)}, expected [{logp.shape[0]}, {logp.shape[1]}, K + 1 = "
                             f"{tr.k + 1}]: TopK(μ, {tr.k}) ∪ {{a_t}} (tr.k is {tr.k})")
