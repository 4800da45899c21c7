"""The weights w_t and the terms added to a token's loss, as pure tensor functions: the KL penalty of prime-rl's
losses (:func:`kl_penalty`), and the pieces of the rules that replace w_t or add a regularizer: DRPO's, SAPO's gate
and MinPRO's prefix minimum. (The IS weight of eq:unified_grad and its decoupled variants, which read the trust
region's choice, are :func:`~dppo_oat.trust_region.loss.importance_weight`.) Inputs are detached ``[B, T]`` tensors
(but ``logp`` where a term's gradient flows).
"""

from __future__ import annotations

import math

import torch

from dppo_oat.trust_region.masks import MAX_LOG_RATIO


def kl_penalty(logp: torch.Tensor, behavior_logp: torch.Tensor, response: torch.Tensor,
               kl_tau: float) -> torch.Tensor:
    """τ·log²(π_θ/μ) on every response token, with gradient 2τ·log(π_θ/μ)·∇log π_θ (prime-rl ``loss.py``
    ``default_loss_fn``: added to the per-token loss of masked and kept tokens alike, aggregated with it)."""
    log_ratio = torch.where(response, logp - behavior_logp, 0.0)
    return kl_tau * log_ratio.square()


def drpo_regularizer(logp: torch.Tensor, anchor_logp: torch.Tensor, advantages: torch.Tensor,
                     response: torch.Tensor, delta: float) -> torch.Tensor:
    """DRPO's regularizer (arXiv 2606.09821 eq. 8) on every response token: ``|A_t|·μ·(r_t − 1)²/(2δ)``, μ the anchor's
    probability and r_t = π_θ/μ (log r clamped at :data:`~dppo_oat.trust_region.masks.MAX_LOG_RATIO`), written
    ``(π − μ)·(r − 1)`` so that it stays finite at r = e^60. With the policy term −r_t·A_t its gradient is
    −r_t·A_t·ω_t·∇log π_θ, ω_t of :func:`drpo_weight`."""
    log_ratio = torch.where(response, logp - anchor_logp, 0.0).clamp(max=MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    shift = anchor_logp.exp() * (ratio - 1)  # π − μ, through r
    return advantages.abs() * shift * (ratio - 1) / (2 * delta)


def drpo_weight(prob: torch.Tensor, anchor_prob: torch.Tensor, advantages: torch.Tensor, delta: float) -> torch.Tensor:
    """DRPO's gradient weight (arXiv 2606.09821 Table 1): ``ω_t = 1 − sign(A_t)·(π − μ)/δ`` = 1 − sign(A_t(r_t − 1))·
    |π − μ|/δ, in [1 − 1/δ, 1 + 1/δ]: below 1 for a move away from μ, 0 at |π − μ| = δ, negative (corrective)
    beyond, above 1 for a move back."""
    return 1 - torch.sign(advantages) * (prob - anchor_prob) / delta


def sapo_gate_slope(ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """f'(r) of SAPO's gate f(r) = σ(τ(r − 1))·4/τ (arXiv 2511.20347; verl ``compute_policy_loss_sapo``
    ``gate_function``): ``4σ(τ(r − 1))(1 − σ(τ(r − 1)))``, τ = τ_pos where A > 0 and τ_neg elsewhere. 1 at r = 1,
    falling smoothly on both sides: a soft trust region. The gradient of −f(r)·A is −r·f'(r)·A·∇log π_θ."""
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1))
    return 4 * gate * (1 - gate)


def prefix_min_log_ratio(log_ratio: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """MinPRO's weight in log space (arXiv 2601.22718): ``min_{j ≤ t} log r_j`` over the row's response tokens up to
    and including t (the prefix ratio ∏_{j ≤ t} r_j's non-cumulative surrogate); 0 off the response."""
    running = torch.where(response, log_ratio, math.inf).cummin(-1).values
    return torch.where(response, running, 0.0)
