"""The metrics every loss call reports: the trust region's batch statistics with the shadow masks
(:func:`trust_region_metrics`) and the training–inference mismatch under the names other frameworks log
(:func:`mismatch_diagnostics`). A rule's own metrics are declared on the rule (:mod:`~dppo_oat.trust_region.rules`).

Inputs are detached fp32 ``[B, T]`` tensors; ``response`` holds the response tokens the loss counts, ``keep`` the
mask M_t.
"""

from __future__ import annotations

import functools
import math

import torch

from dppo_oat import divergence as div
from dppo_oat.trust_region.config import TrustRegion
from dppo_oat.trust_region.masks import MAX_LOG_RATIO, ROLLOUT_CORR_LOG_BOUND, mismatch_keep, ratio_keep
from dppo_oat.trust_region.reductions import fraction, masked_max, masked_mean, masked_std, row_mean

MU_BUCKETS = ((0.0, 0.1, "mu_lt_0.1"), (0.1, 0.5, "mu_0.1_0.5"), (0.5, math.inf, "mu_ge_0.5"))
"""Behavior-probability buckets of the shadow-mask metrics (low-, mid-, high-probability tokens)."""
BAD_UPDATE_THRESHOLD = 0.5
"""sec:stability, Takeaway 3: a 'bad update' is A < 0 and μ − π ≥ 0.5."""
SHADOW_CLIP_RANGES = {"ppo": (0.2, 0.2), "grpo_clip_higher": (0.2, 0.28)}
"""The paper's two ratio clips ``(ε_low, ε_high)`` every run also reports as shadow masks (and tokens.jsonl as
decisions)."""
SHADOW_MISMATCH_PRESETS = ("icepop", "seq_geo_mask")
"""The mismatch masks every run also reports as shadows (their bands from
:data:`~dppo_oat.trust_region.presets.PRESETS`)."""
OVER_DELTA_KL = 0.05
"""The binary KL between μ and π_θ (anchored on μ) above which ``over_delta/*`` counts a token: DPPO-Binary-KL's δ."""
SIGN_CELLS = (("pos_adv", "mu_above"), ("pos_adv", "mu_below"), ("neg_adv", "mu_above"), ("neg_adv", "mu_below"))
"""Sign of Â × sign of μ − π: ``mu_above`` is μ(a_t) > π_θ(a_t) (the rollout engine over-weights the token)."""


def trust_region_metrics(logp, behavior_logp, advantages, response, keep, divergence, truncated,
                         extra: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Batch statistics of the trust region (sec:stability): mask fractions by sign of A (A ≠ 0 tokens only),
    training-inference mismatch |π − μ|, bad updates, IS truncation (``truncated``: tokens whose w_t hit C), and the
    *shadow masks* (:func:`shadow_mask_stats`). ``extra``: 0-d statistics of the rule's own
    (:attr:`~dppo_oat.trust_region.registry.Rule.metrics`), reported after these.

    One host synchronisation: every statistic is a 0-d tensor until the final ``tolist``.
    """
    prob, mu_prob = logp.exp(), behavior_logp.exp()
    ratio = (logp - behavior_logp).clamp(max=MAX_LOG_RATIO).exp()
    active = response & (advantages != 0)
    pos, neg = response & (advantages > 0), response & (advantages < 0)
    blocked = response & ~keep
    abs_diff = (prob - mu_prob).abs()
    stats = {
        "tokens": response.sum().float(),
        "mask/fraction": fraction(blocked, active),
        "mask/fraction_pos_adv": fraction(blocked, pos),
        "mask/fraction_neg_adv": fraction(blocked, neg),
        "mismatch/abs_diff_mean": masked_mean(abs_diff, response),
        "mismatch/abs_diff_max": masked_max(abs_diff, response),
        "bad_update/fraction": fraction(neg & (mu_prob - prob >= BAD_UPDATE_THRESHOLD), active),
        "is/truncated_fraction": fraction(truncated, response),
        "ratio/mean": masked_mean(ratio, response),
        "divergence/mean": masked_mean(divergence, response),
        "divergence/max": masked_max(divergence, response),
    }
    stats.update(shadow_mask_stats(logp, behavior_logp, advantages, response, ratio))
    stats.update(sign_cell_stats(blocked, active, advantages, prob, mu_prob, behavior_logp, logp))
    stats.update({key: value.to(stats["tokens"].dtype) for key, value in (extra or {}).items()})
    values = torch.stack(list(stats.values())).tolist()
    return dict(zip(stats.keys(), values, strict=True))


def shadow_mask_stats(logp, behavior_logp, advantages, response, ratio) -> dict[str, torch.Tensor]:
    """The *shadow masks*: what ``ppo`` and ``grpo_clip_higher`` would have blocked on the batch, by μ bucket
    (sec:method_limitations), and what ``icepop`` and ``seq_geo_mask`` would have masked (with the share of
    responses the latter masks). They read the current π_θ in place of π_θ' (equal on a rollout batch's first
    minibatch), so every run reports them. ``ratio``: π_θ/μ."""
    active = response & (advantages != 0)
    mu_prob = behavior_logp.exp()
    stats = {}
    for preset, (eps_low, eps_high) in SHADOW_CLIP_RANGES.items():
        shadow_blocked = response & ~ratio_keep(ratio, advantages, eps_low, eps_high)
        stats.update(_shadow_stats(preset, shadow_blocked, active, mu_prob))
    mismatch_blocked = {preset: response & ~mismatch_keep(*band, logp, behavior_logp, response)
                        for preset, band in shadow_mismatch_bands().items()}
    for preset, shadow_blocked in mismatch_blocked.items():
        stats.update(_shadow_stats(preset, shadow_blocked, active, mu_prob))
    stats["shadow/seq_geo_mask/sequence_fraction"] = fraction(mismatch_blocked["seq_geo_mask"].any(-1),
                                                              response.any(-1))
    return stats


@functools.cache
def shadow_mismatch_bands() -> dict[str, tuple[str, float, float]]:
    """``(mismatch_mask, mismatch_low, mismatch_high)`` of each of :data:`SHADOW_MISMATCH_PRESETS`."""
    presets = (TrustRegion.preset(name) for name in SHADOW_MISMATCH_PRESETS)
    return {tr.name: (tr.mismatch_mask, tr.mismatch_low, tr.mismatch_high) for tr in presets}


def _shadow_stats(preset: str, blocked: torch.Tensor, active: torch.Tensor, mu_prob: torch.Tensor) -> dict:
    """``shadow/<preset>/mask_fraction`` over the A ≠ 0 tokens, and by μ bucket (:data:`MU_BUCKETS`)."""
    stats = {f"shadow/{preset}/mask_fraction": fraction(blocked, active)}
    for low, high, bucket in MU_BUCKETS:
        in_bucket = active & (mu_prob >= low) & (mu_prob < high)
        stats[f"shadow/{preset}/mask_fraction_{bucket}"] = fraction(blocked, in_bucket)
    return stats


def sign_cell_stats(blocked, active, advantages, prob, mu_prob, behavior_logp, logp) -> dict[str, torch.Tensor]:
    """Shares of the A ≠ 0 tokens by sign of Â and of μ − π (:data:`SIGN_CELLS`): ``over_delta/<cell>``, tokens
    whose binary KL to μ exceeds :data:`OVER_DELTA_KL` whatever the rule did (so a run without a mask reports
    where a μ-anchored mask would act), and ``mask_cell/<cell>_<μ bucket>``, the tokens the run's mask blocked."""
    over = active & (div.binary_kl(behavior_logp, logp) > OVER_DELTA_KL)
    signs = {"pos_adv": advantages > 0, "neg_adv": advantages < 0, "mu_above": mu_prob > prob,
             "mu_below": mu_prob < prob}
    stats = {}
    for adv, direction in SIGN_CELLS:
        cell = signs[adv] & signs[direction]
        stats[f"over_delta/{adv}_{direction}"] = fraction(over & cell, active)
        for low, high, bucket in MU_BUCKETS:
            in_bucket = cell & (mu_prob >= low) & (mu_prob < high)
            stats[f"mask_cell/{adv}_{direction}_{bucket}"] = fraction(blocked & in_bucket, active)
    return stats


def mismatch_diagnostics(logp: torch.Tensor, behavior_logp: torch.Tensor, response: torch.Tensor,
                         weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far π_θ is from μ on a batch, under the names other frameworks log, as 0-d tensors (inputs detached fp32
    ``[B, T]``; ``weight`` the loss's w_t). A sequence is a row (one turn); the statistics over sequences take the
    rows with a response token.

    verl ``rollout_corr_helper.compute_offpolicy_metrics`` (under ``rollout_corr/``): ``kl`` (mean log μ − log π),
    ``k3_kl`` (mean r − 1 − log r, r = π/μ), ``chi2_token`` (mean r² − 1) and ``chi2_seq`` (mean over sequences of
    (∏ r)² − 1, log ∏ r clamped at ±20), ``training_ppl`` / ``rollout_ppl`` (mean over sequences of exp(−mean log π) /
    of μ), ``log_ppl_diff`` and ``ppl_ratio`` (mean over sequences of mean log μ − mean log π, and of its exp);
    ``compute_is_metrics``'s ``rollout_is_eff_sample_size``, 1/mean((w/mean w)²) over the response tokens, here of
    the loss's own w_t. ``k3_kl_seq`` (this project's: verl logs no sequence k3) is the mean over sequences of
    Σ_t k3, an estimate of the sequence-level KL(μ ‖ π). SkyRL ``trainer.py``:
    ``policy/rollout_train_logprobs_abs_diff_{mean,std,max}`` of |log π − log μ| (std with Bessel's correction).
    ``mismatch/abs_diff_std`` is the std of |π − μ| beside :func:`trust_region_metrics`'s mean and max."""
    log_ratio = torch.where(response, (logp - behavior_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
    rows = response.any(-1)
    sum_log_ratio = log_ratio.sum(-1)
    bounded = log_ratio.clamp(-ROLLOUT_CORR_LOG_BOUND, ROLLOUT_CORR_LOG_BOUND)
    k3 = torch.where(response, log_ratio.exp() - 1 - log_ratio, 0.0)
    mean_logp = row_mean(logp, response).squeeze(-1)
    mean_mu = row_mean(behavior_logp, response).squeeze(-1)
    log_ppl_diff = mean_mu - mean_logp
    abs_log_diff = log_ratio.abs()
    abs_diff = (logp.exp() - behavior_logp.exp()).abs()
    return {
        "rollout_corr/kl": masked_mean(-log_ratio, response),
        "rollout_corr/k3_kl": masked_mean(k3, response),
        "rollout_corr/k3_kl_seq": masked_mean(k3.sum(-1), rows),
        "rollout_corr/chi2_token": masked_mean((2 * bounded).exp(), response) - 1,
        "rollout_corr/chi2_seq": masked_mean((2 * sum_log_ratio.clamp(-20.0, 20.0)).exp(), rows) - 1,
        "rollout_corr/training_ppl": masked_mean((-mean_logp).exp(), rows),
        "rollout_corr/rollout_ppl": masked_mean((-mean_mu).exp(), rows),
        "rollout_corr/log_ppl_diff": masked_mean(log_ppl_diff, rows),
        "rollout_corr/ppl_ratio": masked_mean(log_ppl_diff.exp(), rows),
        "rollout_corr/rollout_is_eff_sample_size": effective_sample_size(weight, response),
        "policy/rollout_train_logprobs_abs_diff_mean": masked_mean(abs_log_diff, response),
        "policy/rollout_train_logprobs_abs_diff_std": masked_std(abs_log_diff, response),
        "policy/rollout_train_logprobs_abs_diff_max": masked_max(abs_log_diff, response),
        "mismatch/abs_diff_std": masked_std(abs_diff, response),
    }


def effective_sample_size(weight: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """verl ``compute_is_metrics``' ``rollout_is_eff_sample_size``: 1/mean((w/mean w)²) over the response tokens
    (1: uniform weights, and for a batch without a response token)."""
    weight = torch.where(response, weight, 0.0)
    weight = weight / weight.amax().clamp(min=torch.finfo(weight.dtype).tiny)  # ESS is scale-free; w² stays finite
    tiny = torch.finfo(weight.dtype).tiny
    ess = masked_mean(weight, response).square() / masked_mean(weight.square(), response).clamp(min=tiny)
    return torch.where(response.any(), ess, 1.0)
