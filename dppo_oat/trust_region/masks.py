"""The masks M_t as pure tensor functions: True where a token's update is kept.

Each is one method's mask as its source writes it, on detached ``[B, T]`` tensors (``response``: the response
tokens, a row being one response, one turn). The rules (:mod:`~dppo_oat.trust_region.rules`) apply them to a batch;
the shadow masks (:mod:`~dppo_oat.trust_region.metrics`) and the token samples apply PPO's and DPPO's on their own.
"""

from __future__ import annotations

import math

import torch

from dppo_oat.trust_region.reductions import row_max, row_mean, sum_before

MAX_LOG_RATIO = 60.0
"""log r is clamped here before exp so that r stays finite in fp32 (log-probs down to −60 are exact)."""
ROLLOUT_CORR_LOG_BOUND = 20.0
"""verl clamps log r to ``[−20, 20]`` before its k2/k3 statistics (``rollout_corr_helper.SAFETY_BOUND``) and SAPO's
ratio (``core_algos.compute_policy_loss_sapo``); the rules that follow those sources do the same."""
GSPO_LOG_RATIO_CAP = 10.0
"""verl's ``compute_policy_loss_gspo`` clamps log s_i at 10 (``torch.clamp(..., max=10.0)``): above it no gradient
passes."""
PREFIX_BUDGET_QUANTILE = 0.9
"""CPPO's per-response budget δ_b^seq is calibrated on this quantile (P90) of the response's D_t."""
PREFIX_BUDGET_CEILING = 2.0
"""CPPO's δ_b^seq is clamped to ``[δ_b, PREFIX_BUDGET_CEILING · δ_b]`` (δ_b: the TrustRegion's floor)."""


# --------------------------------------------------------------------------------------------- the paper's masks


def ratio_keep(ratio, advantages, eps_low, eps_high) -> torch.Tensor:
    """PPO's clip mask (eq:ppo-clip as a mask): block A>0 & r>1+ε_high and A<0 & r<1−ε_low."""
    blocked = ((advantages > 0) & (ratio > 1 + eps_high)) | ((advantages < 0) & (ratio < 1 - eps_low))
    return ~blocked


def relaxed_clip_range(behavior_prob, eps_low: float, eps_high: float, alpha: float,
                       relax: str) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """The α study (sec:training_efficiency): ε = ∞ for tokens with μ < α on the side(s) ``relax`` names (``none``,
    ``low``, ``high`` or ``both``)."""
    if relax == "none":
        return eps_low, eps_high
    low_prob = behavior_prob < alpha
    inf = torch.full_like(behavior_prob, math.inf)
    relaxed_low = torch.where(low_prob, inf, eps_low) if relax in ("low", "both") else eps_low
    relaxed_high = torch.where(low_prob, inf, eps_high) if relax in ("high", "both") else eps_high
    return relaxed_low, relaxed_high


def divergence_keep(ratio, advantages, divergence, delta, side: str = "both") -> torch.Tensor:
    """DPPO's mask (eq:dppo_obj): block A>0 & r>1 & D>δ and A<0 & r<1 & D>δ (``side``: both halves, or only the
    ``negative`` or the ``positive`` one, :data:`~dppo_oat.trust_region.config.MASK_SIDES`).

    An update that moves r back toward 1 is never blocked. With ``D = |r − 1|`` this is PPO's mask. A NaN D counts
    as outside: an unknown divergence is no licence to move further.
    """
    outside = ~(divergence <= delta)
    positive = (advantages > 0) & (ratio > 1) & outside if side != "negative" else torch.zeros_like(outside)
    negative = (advantages < 0) & (ratio < 1) & outside if side != "positive" else torch.zeros_like(outside)
    return ~(positive | negative)


def negative_keep(anchor_prob, prob, advantages, delta) -> torch.Tensor:
    """Takeaway 3's minimal mask (sec:stability): block A<0 & anchor(a_t) − π(a_t) ≥ δ."""
    return ~((advantages < 0) & (anchor_prob - prob >= delta))


# --------------------------------------------------------------------------------------------- CPPO


def position_weights(response: torch.Tensor, w_min: float) -> torch.Tensor:
    """CPPO's w_t (arXiv 2606.10968 eq. 9, Algorithm 1): ``1 − (1 − w_min)(t − 1)/(T − 1)``, t the 1-based position
    among the row's response tokens and T their number: 1 at the first token, w_min at the last (1 for a one-token
    response), 0 off the response. fp64 ``[B, T]``."""
    position = response.long().cumsum(-1)
    length = response.long().sum(-1, keepdim=True)
    elapsed = (position - 1).clamp(min=0).double() / (length - 1).clamp(min=1).double()
    return torch.where(response, 1.0 - (1.0 - w_min) * elapsed, 0.0)


def prefix_budget(divergence: torch.Tensor, response: torch.Tensor, delta_b: float) -> torch.Tensor:
    """CPPO's per-response budget δ_b^seq (arXiv 2606.10968 eq. 22): the P90 of the row's D_t over its response
    tokens, clamped to ``[δ_b, 2δ_b]`` (:data:`PREFIX_BUDGET_QUANTILE`, :data:`PREFIX_BUDGET_CEILING`); δ_b for a row
    with no response token or no finite D_t. fp64 ``[B, 1]``."""
    values = torch.where(response, divergence.double(), math.nan)
    quantile = torch.nanquantile(values, PREFIX_BUDGET_QUANTILE, dim=-1, keepdim=True)
    budget = quantile.clamp(min=delta_b, max=PREFIX_BUDGET_CEILING * delta_b)
    return torch.where(torch.isnan(quantile), delta_b, budget)


def prefix_thresholds(divergence: torch.Tensor, response: torch.Tensor, delta: float, w_min: float,
                      delta_b: float) -> tuple[torch.Tensor, ...]:
    """``(Z_t, c_t, δ_b^seq)`` of CPPO (arXiv 2606.10968 eq. 8): Z_t = w_t·D_t and the effective threshold
    ``c_t = min(δ, δ + δ_b^seq·W_{t−1} − S_{t−1})``, S and W the sums of Z and w over the response's earlier tokens
    (S_0 = W_0 = 0). A NaN D_t makes every later c_t NaN: an unknown prefix leaves no budget. fp64 ``[B, T]``."""
    weights = position_weights(response, w_min)
    z = weights * torch.where(response, divergence.double(), 0.0)
    budget = prefix_budget(divergence, response, delta_b)
    c = torch.clamp(delta + budget * sum_before(weights) - sum_before(z), max=delta)
    return z, c, budget


def prefix_budget_keep(ratio, advantages, divergence, response, delta: float, w_min: float,
                       delta_b: float) -> torch.Tensor:
    """CPPO's mask (arXiv 2606.10968 eq. 10): keep t iff A_t(r_t − 1) ≤ 0 (toward the anchor) or Z_t ≤ c_t
    (:func:`prefix_thresholds`). With w_min = 1 and a δ_b too large to bind it is DPPO's :func:`divergence_keep`."""
    z, c, _ = prefix_thresholds(divergence, response, delta, w_min, delta_b)
    away = ((advantages > 0) & (ratio > 1)) | ((advantages < 0) & (ratio < 1))
    return ~(away & ~(z <= c))


# --------------------------------------------------------------------------------------------- M2PO


def m2po_trust_region(log_ratio: torch.Tensor, advantages: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """The tokens M2PO constrains (arXiv 2510.01161 sec. 5.2, as PPO's clip would): A > 0 & r > 1 or A < 0 & r < 1."""
    return response & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))


def second_moment_keep(log_ratio: torch.Tensor, advantages: torch.Tensor, response: torch.Tensor,
                       tau_m2: float) -> torch.Tensor:
    """M2PO's mask (arXiv 2510.01161 Algorithm 1): among the trust-region tokens T (response tokens with A > 0 and
    r > 1, or A < 0 and r < 1), block those of largest M̂2_i = (log r_i)² until the mean over T of the rest is
    ≤ τ_M2. The running mean of ascending values never decreases, so the kept ones are the longest ascending prefix
    whose mean is ≤ τ_M2 (no host synchronisation). Over the whole ``[B, T]`` batch."""
    trust = m2po_trust_region(log_ratio, advantages, response)
    second_moment = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).double().square().reshape(-1)
    flat_trust = trust.reshape(-1)
    ordered, order = torch.where(flat_trust, second_moment, math.inf).sort(stable=True)
    count = torch.arange(1, ordered.numel() + 1, device=ordered.device, dtype=torch.float64)
    prefix_mean = torch.where(torch.isfinite(ordered), ordered, 0.0).cumsum(0) / count
    kept = ((prefix_mean <= tau_m2) & (count <= flat_trust.sum())).sum()
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return ~(flat_trust & (rank >= kept)).reshape(response.shape)


# --------------------------------------------------------------------------------------------- the mismatch band


def band_keep(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``low ≤ exp(log_ratio) ≤ high``, compared in log space (``low`` 0: no lower bound, ``high`` ∞: no upper)."""
    keep = torch.ones_like(log_ratio, dtype=torch.bool)
    if low > 0:
        keep &= log_ratio >= math.log(low)
    if math.isfinite(high):
        keep &= log_ratio <= math.log(high)
    return keep


def mismatch_keep(kind: str, low: float, high: float, recomputed_logp, behavior_logp, response) -> torch.Tensor:
    """The mask on ρ_t = π_θ'/μ of kind ``kind`` (:data:`~dppo_oat.trust_region.config.MISMATCH_MASKS`; all True
    for ``none``) with the band ``[low, high]``. Inputs detached fp32 ``[B, T]``.

    ``token``: ρ_t in the band (OpenRLHF ``loss.py`` icepop; AReaL ``apply_rejection_sampling``, token level).
    ``seq_geo``: the response's exp(mean_t log ρ_t) in the band (SkyRL ``compute_sequence_mask``, geometric).
    """
    if kind == "none":
        return torch.ones_like(response, dtype=torch.bool)
    log_rho = recomputed_logp - behavior_logp
    if kind == "seq_geo":
        log_rho = row_mean(log_rho, response).expand_as(log_rho)
    return band_keep(log_rho, low, high)


# --------------------------------------------------------------------------------------------- the field after DPPO


def symmetric_band_keep(divergence: torch.Tensor, delta: float) -> torch.Tensor:
    """The IPO band (prime-rl ``loss.py`` ``ipo_loss_fn``): keep t iff D_t = |π − μ| ≤ δ, whatever the sign of A_t and
    the direction of the move (a NaN D counts as outside)."""
    return divergence <= delta


def sequence_statistic_keep(divergence: torch.Tensor, response: torch.Tensor, bound: float,
                            reduce: str) -> torch.Tensor:
    """TRM's sequence mask (arXiv 2512.23075; verl ``compute_rollout_rejection_mask`` ``seq_max_*``/``seq_mean_*``):
    every token of a row is kept iff the ``max`` or ``mean`` of its response tokens' ``divergence`` is ≤ ``bound``
    (a NaN statistic counts as outside). ``[B, T]``, the same for every token of a row."""
    statistic = row_max(divergence, response) if reduce == "max" else row_mean(divergence, response)
    return (statistic <= bound).expand_as(divergence)


def off_policy_sequence_keep(log_ratio: torch.Tensor, advantages: torch.Tensor, response: torch.Tensor,
                             delta: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL ``GRPOTrainer.get_off_policy_mask``): keep t iff A_t ≥ 0 or the
    row's mean of ``log μ − log π_θ`` over its response tokens is ≤ δ (``log_ratio`` = log π_θ − log μ)."""
    mean_log_mu_over_pi = -row_mean(log_ratio, response)
    return (advantages >= 0) | (mean_log_mu_over_pi <= delta)


def directional_sequence_keep(anchor_logp: torch.Tensor, behavior_logp: torch.Tensor, advantages: torch.Tensor,
                              response: torch.Tensor, delta: float) -> torch.Tensor:
    """VACO's mask as open-instruct PR #1755 computes it (``grpo_utils.compute_rho_correction``, ``vaco`` with
    ``tv``): block t iff the row's mean binary TV ``|π_θ' − μ|`` over its response tokens exceeds δ and the update of
    t moves π_θ' further from μ, ``sign(log π_θ' − log μ)·A_t > 0``. ``anchor_logp`` is log π_θ'."""
    tv = torch.where(response, (anchor_logp.exp() - behavior_logp.exp()).abs(), 0.0)
    outside = row_mean(tv, response) > delta
    moving_away = torch.sign(anchor_logp - behavior_logp) * advantages > 0
    return ~(outside & moving_away)


def gspo_keep(sequence_log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float,
              eps_high: float) -> torch.Tensor:
    """GSPO's clip as a mask (arXiv 2507.18071; verl ``compute_policy_loss_gspo``): PPO's clip (:func:`ratio_keep`)
    on the sequence ratio s_i = exp(mean_t log r_t) (``sequence_log_ratio``: log s_i, ``[B, 1]``), and no gradient
    where log s_i > :data:`GSPO_LOG_RATIO_CAP`."""
    capped = sequence_log_ratio <= GSPO_LOG_RATIO_CAP
    ratio = sequence_log_ratio.clamp(max=GSPO_LOG_RATIO_CAP).exp()
    return ratio_keep(ratio, advantages, eps_low, eps_high) & capped
