"""The core's :func:`~dppo_oat.trust_region.policy_loss` as verl policy losses (``verl.trainer.ppo.core_algos``).

verl 0.9.1 calls a registered loss as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights)`` and expects ``(scalar loss, metrics dict of floats)`` back (``workers/utils/losses.py``,
``ppo_loss``). Here the per-token loss of eq:unified_grad comes from the core and is reduced by verl's own
``agg_loss`` with ``config.global_batch_info``, so data-parallel scaling is verl's, as for its built-in losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss

from dppo_oat.engines.verl.mapping import (
    METRIC_PREFIX,
    anchoring_problem,
    loss_name,
    rollout_correction_of,
    supported_presets,
    trust_region_for,
)
from dppo_oat.trust_region import TrustRegion, policy_loss

REGISTERED: dict[str, str] = {}
"""``loss_mode -> preset`` of every loss this adapter put into verl's registry."""
REFUSED: dict[str, str] = {}
"""``loss_mode -> one-line reason`` of every preset verl cannot run faithfully."""


def anchors(tr: TrustRegion, old_log_prob, response_mask, rollout_is_weights, config) -> dict[str, torch.Tensor]:
    """The core's ``behavior_logp`` (μ) and ``recomputed_logp`` (π_θ') from what verl hands a loss.

    Bypass mode: ``old_log_prob`` is μ (rules that read μ only). Decoupled mode: ``old_log_prob`` is π_θ' and the
    untruncated token IS weights are π_θ'/μ, so ``log μ = log π_θ' − log w`` (rules that also read π_θ').
    """
    problem = anchoring_problem(tr, rollout_correction_of(config))
    if problem:
        raise ValueError(problem)
    if not tr.needs_recompute:
        if rollout_is_weights is not None:
            raise ValueError(f"{loss_name(tr.name)} got rollout IS weights, so old_log_prob is not μ: run verl in "
                             "bypass mode (algorithm.rollout_correction.bypass_mode=true)")
        return {"behavior_logp": old_log_prob}
    if rollout_is_weights is None:
        raise ValueError(f"{loss_name(tr.name)} needs μ: set algorithm.rollout_correction.rollout_is=token")
    log_weight = torch.log(rollout_is_weights.float().clamp(min=torch.finfo(torch.float32).tiny))
    behavior = torch.where(response_mask.bool(), old_log_prob.float() - log_weight, old_log_prob.float())
    return {"behavior_logp": behavior, "recomputed_logp": old_log_prob}


def verl_compat_metrics(old_log_prob, log_prob, response_mask, keep) -> dict[str, float]:
    """verl's usual ``actor/pg_clipfrac`` (masked tokens) and ``actor/ppo_kl`` (mean log(old/π)), as in core_algos.py's
    ``compute_policy_loss_dppo_tv``, so verl's dashboards keep working."""
    mask = response_mask.bool()
    count = mask.sum().clamp(min=1)
    clipfrac = (mask & ~keep).sum() / count
    ppo_kl = torch.where(mask, old_log_prob.detach().float() - log_prob.detach().float(), 0.0).sum() / count
    clipfrac, ppo_kl = torch.stack([clipfrac.float(), ppo_kl]).tolist()
    return {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl}


def make_policy_loss(preset: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    """verl's ``PolicyLossFn`` for ``preset``: δ/ε/C from the actor config (:func:`~.mapping.trust_region_for`),
    the anchor from verl's operating mode (:func:`anchors`), the core's metrics under
    :data:`~.mapping.METRIC_PREFIX`."""

    def dppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                         rollout_is_weights=None):
        if config is None:
            raise ValueError(f"{loss_name(preset)} needs verl's actor config")
        tr = trust_region_for(preset, config)
        out = policy_loss(log_prob, advantages=advantages, response_mask=response_mask.bool(), tr=tr,
                          **anchors(tr, old_log_prob, response_mask, rollout_is_weights, config))
        batch_info = dict(getattr(config, "global_batch_info", None) or {})
        loss = agg_loss(loss_mat=out.loss, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        metrics = {METRIC_PREFIX + key: value for key, value in out.metrics.items()}
        metrics.update(verl_compat_metrics(old_log_prob, log_prob, response_mask, out.keep))
        return loss, metrics

    dppo_policy_loss.__name__ = f"dppo_policy_loss_{preset}"
    dppo_policy_loss.__doc__ = f"The core's preset {preset!r} (dppo_oat.trust_region.PRESETS) as a verl policy loss."
    return dppo_policy_loss


def register_all() -> dict[str, str]:
    """Register ``dppo_oat.<preset>`` for every preset the core has now; record the refused ones with their reason.

    Idempotent: importing the adapter again (every worker does) registers the same functions again.
    """
    for preset, reason in supported_presets().items():
        name = loss_name(preset)
        if reason:
            REFUSED[name] = reason
            POLICY_LOSS_REGISTRY.pop(name, None)
            continue
        register_policy_loss(name)(make_policy_loss(preset))
        REGISTERED[name] = preset
    return dict(REGISTERED)
