"""The policy update: one rollout batch → epochs × minibatches of ``policy_loss`` steps.

Written once, for the engines whose update loop is ours (local and oat; verl runs its own and takes only the loss):
the model's forward pass, the backward pass and the optimizer step are parameters, so the local engine passes a
plain torch model and optimizer while the oat engine passes oat's DeepSpeed strategy.

Per rollout batch (as in PPO with several updates per rollout):
1. if the trust region reads π_θ' (``minirl``, ``*_recompute``, the mismatch presets), recompute π_θ'(a_t) once,
   without grad;
2. for each of ``num_epochs`` epochs, shuffle and split into minibatches; each minibatch is one optimizer step,
   accumulated over micro-batches: forward (fp32 log-probs, entropy, top-K gather) → :func:`policy_loss` →
   aggregation → backward; then the optimizer step (with gradient clipping inside ``optimizer_step``).

The forward pass is a :data:`~dppo_oat.learner.forward.ForwardFn` (π_θ at the sampling temperature, e.g.
:func:`~dppo_oat.learner.forward.causal_lm_forward`). Every minibatch goes through the blow-up guard
(:mod:`dppo_oat.learner.guard`): one with a non-finite loss or μ is discarded, not applied, and a run that diverged
stops with :class:`~dppo_oat.errors.TrainingBlewUp`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from dppo_oat.aggregation import aggregate_loss
from dppo_oat.errors import TrainingBlewUp
from dppo_oat.learner.forward import ForwardFn, causal_lm_forward
from dppo_oat.learner.guard import (
    DIVERGED,
    HEALTHY,
    LOSS_SCALE_SKIPS,
    NONFINITE_CAUSES,
    NONFINITE_PI,
    SKIPPED,
    STOPPING_CAUSES,
    AnyLearner,
    BlowUpGuard,
    check_policy_finite,
    diverged_error,
    minibatch_state,
    nonfinite_cause,
    one_learner,
    zero_surrogate,
)
from dppo_oat.run.token_samples import TokenSampler
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.trust_region import TopK, TrustRegion, masked_mean, policy_loss
from dppo_oat.update_batch import UpdateBatch

BackwardFn = Callable[[torch.Tensor], None]
OptimizerStepFn = Callable[[], "dict[str, float] | None"]
"""Applies the minibatch's accumulated gradients. Must not apply a non-finite gradient: then it discards it and
returns ``{SKIPPED: 1.0}`` among its metrics."""
DiscardStepFn = Callable[[], "dict[str, float] | None"]
"""Drops the minibatch's accumulated gradients without changing the weights (the guard's skip)."""


def clip_and_step(parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                  max_grad_norm: float) -> dict[str, float]:
    """A plain torch :data:`OptimizerStepFn`: clip the gradient norm, step unless it is non-finite, zero grads."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm))
    applied = math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": grad_norm, **({} if applied else {SKIPPED: 1.0, "guard/nonfinite_grad": 1.0})}


def scaled_clip_and_step(parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                         scaler: torch.amp.GradScaler, max_grad_norm: float) -> dict[str, float]:
    """An :data:`OptimizerStepFn` for loss-scaled gradients (float16, :mod:`dppo_oat.learner.autocast`): unscale,
    clip the norm, step, and let the scaler adapt its scale. A non-finite gradient at a scale above 1 is an overflow
    of the scaling itself: the step is skipped and counted in :data:`~dppo_oat.learner.guard.LOSS_SCALE_SKIPS` (never a
    reason to stop), and the scale halves; it reports no gradient norm. At a scale of 1 or below the gradient itself
    is non-finite: the blow-up guard's skip (:data:`~dppo_oat.learner.guard.SKIPPED`), ``patience`` of which in a row
    stop the run, and the scale stays."""
    scale = float(scaler.get_scale())
    scaler.unscale_(optimizer)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm))
    applied = math.isfinite(grad_norm)
    overflow = not applied and scale > 1.0
    if applied:
        scaler.step(optimizer)
    # the inf check of unscale_ halves the scale on an overflow, else it may grow; at a scale of 1 or below a
    # non-finite gradient is not the scaling's doing, and the scale stays
    scaler.update(None if applied or overflow else scale)
    optimizer.zero_grad(set_to_none=True)
    metrics = {"loss_scale": scale, LOSS_SCALE_SKIPS: 0.0}
    if overflow:  # routine while the scale settles: no gradient norm to average into the step's
        metrics[LOSS_SCALE_SKIPS] = 1.0
        return metrics
    metrics["grad_norm"] = grad_norm
    if not applied:
        metrics.update({SKIPPED: 1.0, "guard/nonfinite_grad": 1.0})
    return metrics


@torch.no_grad()
def recompute_logprobs(batch: UpdateBatch, forward: ForwardFn, micro_batch_size: int) -> torch.Tensor:
    """log π_θ'(a_t) of the current (rollout) weights, before any update: the anchor of ``minirl``/``*_recompute``."""
    out = torch.zeros_like(batch.behavior_logp, dtype=torch.float32)
    for index in torch.arange(len(batch), device=out.device).split(micro_batch_size):
        logp = forward(batch.select(index), False).logp
        out[index, : logp.shape[1]] = logp.float()
    return out


def with_recomputed_logprobs(batch: UpdateBatch, tr: TrustRegion, forward: ForwardFn,
                             settings: UpdateSettings) -> UpdateBatch:
    """``batch`` with π_θ'(a_t) (:func:`recompute_logprobs`) where ``tr`` reads it and the batch lacks it."""
    if not tr.needs_recompute or batch.recomputed_logp is not None:
        return batch
    micro = settings.micro_batch_size or settings.minibatch_size
    return replace(batch, recomputed_logp=recompute_logprobs(batch, forward, micro))


@torch.no_grad()
def observe_before_update(batch: UpdateBatch, tr: TrustRegion, forward: ForwardFn, settings: UpdateSettings,
                          observer: TokenSampler, *, generator: torch.Generator | None = None) -> UpdateBatch:
    """Every loss call of the update's first epoch as the update will make it (the same shuffle, from a copy of
    ``generator``, and the same micro-batches), but at the weights before it and with no step taken: ``observer``
    sees each (as ``token_sampler`` does in :func:`update_policy`). What a band set before the update reads
    (``--tr-calibrate``). Returns ``batch`` with π_θ' where ``tr`` reads it, for the update to reuse."""
    batch = with_recomputed_logprobs(batch, tr, forward, settings)
    order = None if generator is None else torch.Generator().set_state(generator.get_state())
    for index in minibatch_indices(len(batch), settings.minibatch_size, order):
        minibatch_step(batch, index, tr, forward, lambda loss: None, settings, observer)
    return batch


def minibatch_indices(num_rows: int, minibatch_size: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    """A random permutation of the rows, split into minibatches (the last one may be smaller); drawn on the host,
    as ``generator`` is, so that the order is the same on every device."""
    return list(torch.randperm(num_rows, generator=generator, device="cpu").split(minibatch_size))


def update_policy(
    batch: UpdateBatch,
    tr: TrustRegion,
    forward: ForwardFn,
    backward: BackwardFn,
    optimizer_step: OptimizerStepFn,
    settings: UpdateSettings,
    *,
    generator: torch.Generator | None = None,
    on_step: Callable[[], None] | None = None,
    discard_step: DiscardStepFn | None = None,
    guard: BlowUpGuard | None = None,
    token_sampler: TokenSampler | None = None,
    any_learner: AnyLearner = one_learner,
) -> list[dict[str, float]]:
    """All optimizer steps of one rollout batch; returns one metrics dict per step.

    ``discard_step`` lets the guard skip a minibatch with a non-finite loss or μ (without it such a minibatch stops
    the run at once); ``guard`` carries the count of skips in a row across rollout batches; ``token_sampler`` sees
    every token of the first epoch with π_θ of its forward pass (the ``tokens.jsonl`` sample); ``any_learner``
    agrees every step, skip and stop with the other learners (:data:`AnyLearner`).
    """
    guard = guard or BlowUpGuard()
    batch = with_recomputed_logprobs(batch, tr, forward, settings)
    if tr.uses_topk and batch.topk_ids is None:
        raise ValueError(f"trust region {tr.name!r} needs the rollout's top-K set (generate with top_k_logprobs=K)")
    history = []
    for epoch in range(settings.num_epochs):
        for index in minibatch_indices(len(batch), settings.minibatch_size, generator):
            sampler = token_sampler if epoch == 0 else None
            metrics = minibatch_step(batch, index, tr, forward, backward, settings, sampler)
            metrics.update(finish_minibatch(metrics, optimizer_step, discard_step, any_learner))
            metrics["epoch"] = float(epoch)
            guard.observe(metrics)
            history.append(metrics)
            if on_step is not None:
                on_step()
    check_policy_finite(batch, forward, any_learner=any_learner)
    return history


@dataclass(frozen=True)
class EngineSteps:
    """An engine's side of the update: how a micro-batch's loss is backpropagated, and how a minibatch's accumulated
    gradients are applied (:data:`OptimizerStepFn`) or dropped (:data:`DiscardStepFn`)."""

    backward: BackwardFn
    optimizer_step: OptimizerStepFn
    discard_step: DiscardStepFn


def learn_from_rollout(model, batch: UpdateBatch, tr: TrustRegion, settings: UpdateSettings, steps: EngineSteps, *,
                       shuffle: torch.Generator | None, guard: BlowUpGuard, token_sampler: TokenSampler | None,
                       precision: Callable[[ForwardFn], ForwardFn] | None = None, lm_head: str = "fused",
                       chunk_size: int | None = None, any_learner: AnyLearner = one_learner) -> list[dict[str, float]]:
    """Every optimizer step of one rollout batch on a causal LM, as the local and oat engines take them: π_θ from
    :func:`~dppo_oat.learner.forward.causal_lm_forward` (at the sampling temperature; the fused head unless
    ``lm_head`` is ``logits``), run under ``precision`` (e.g. an autocast) when given, then :func:`update_policy`
    with the engine's ``steps``."""
    forward = policy_forward(model, settings, precision=precision, lm_head=lm_head, chunk_size=chunk_size)
    return update_policy(batch, tr, forward, steps.backward, steps.optimizer_step, settings, generator=shuffle,
                         discard_step=steps.discard_step, guard=guard, token_sampler=token_sampler,
                         any_learner=any_learner)


def policy_forward(model, settings: UpdateSettings, *, precision: Callable[[ForwardFn], ForwardFn] | None = None,
                   lm_head: str = "fused", chunk_size: int | None = None) -> ForwardFn:
    """π_θ of a causal LM as the update reads it (:func:`~dppo_oat.learner.forward.causal_lm_forward`, at the
    sampling temperature), run under ``precision`` (e.g. an autocast) when given."""
    forward = causal_lm_forward(model, settings=settings, chunk_size=chunk_size, lm_head=lm_head)
    return forward if precision is None else precision(forward)


def finish_minibatch(metrics: dict[str, float], optimizer_step: OptimizerStepFn, discard_step: DiscardStepFn | None,
                     any_learner: AnyLearner = one_learner) -> dict[str, float]:
    """The optimizer step of a minibatch that is healthy on every learner, else the discard of it everywhere (a
    skip), and the end of the run everywhere when π_θ diverged on any learner; every guard metric, 0 or 1."""
    out = {SKIPPED: 0.0, **{key: 0.0 for key in NONFINITE_CAUSES}}
    poisoned = [key for key in NONFINITE_CAUSES if metrics.get(key)]
    state = any_learner(minibatch_state(poisoned))
    if state == HEALTHY:
        out.update(optimizer_step() or {})
        return out
    if discard_step is not None:
        out.update(discard_step() or {})
    if state == DIVERGED:
        stops = [cause for cause in poisoned if cause in STOPPING_CAUSES]
        raise diverged_error(here=bool(stops), cause=stops[0] if stops else NONFINITE_PI)
    if discard_step is None:
        cause = NONFINITE_CAUSES[poisoned[0]] if poisoned else "a value on another learner"
        raise TrainingBlewUp(f"{cause} non-finite, and this engine cannot skip a step")
    out.update({SKIPPED: 1.0, **{key: 1.0 for key in poisoned}})
    return out


def minibatch_step(batch, index, tr, forward, backward, settings: UpdateSettings,
                   token_sampler: TokenSampler | None = None) -> dict[str, float]:
    """Forward + loss + backward over the micro-batches of one minibatch (gradients accumulate). A micro-batch with
    a non-finite loss or μ backpropagates a zero-gradient surrogate instead and marks the minibatch (guard/...)."""
    micro_size = settings.micro_batch_size or len(index)
    totals = _micro_denominators(batch.response_mask[index], settings.aggregation)
    collected, poisoned = [], set()
    for micro_index in index.split(micro_size):
        micro = batch.select(micro_index)
        out = forward(micro, tr.uses_topk)
        topk = None
        if tr.uses_topk:
            topk = TopK(micro.topk_ids, micro.topk_behavior_logp, out.topk_logp, micro.topk_valid)
        result = policy_loss(
            out.logp, micro.behavior_logp, micro.advantages, micro.response_mask, tr,
            recomputed_logp=micro.recomputed_logp, topk=topk,
        )
        loss = aggregate_loss(result.loss, micro.response_mask, settings.aggregation,
                              norm_constant=settings.norm_constant)
        share = _micro_denominators(micro.response_mask, settings.aggregation) / totals
        cause = nonfinite_cause(out.logp, micro.behavior_logp, loss, micro.response_mask, topk, micro.advantages)
        if cause is not None:
            poisoned.add(cause)
        elif token_sampler is not None:
            token_sampler.observe(micro_index, micro, out.logp, out.entropy, result)
        backward(zero_surrogate(out.logp, micro.response_mask) if cause or poisoned else
                 (loss * share if settings.scale_micro_batches else loss))
        metrics = dict(result.metrics, loss=loss.item())
        if out.entropy is not None:
            metrics["entropy"] = float(masked_mean(out.entropy.detach().float(), micro.response_mask))
        collected.append((metrics, share))
    return {**combine_micro_metrics(collected), **{key: 1.0 for key in poisoned}}


def _micro_denominators(response_mask: torch.Tensor, aggregation: str) -> float:
    """What the aggregation divides by: tokens (``token-mean``) or sequences with a response token."""
    if aggregation == "token-mean":
        return float(response_mask.sum().clamp(min=1).item())
    return float((response_mask.sum(-1) > 0).sum().clamp(min=1).item())


def combine_micro_metrics(collected: Sequence[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Micro-batch metrics → minibatch metrics: ``tokens`` add up, maxima take the max, the rest (``loss``
    included) are averaged with the micro-batches' shares of the minibatch's aggregation denominator."""
    combined: dict[str, float] = {}
    total_share = sum(share for _, share in collected) or 1.0
    for key in collected[0][0]:
        values = np.array([m[key] for m, _ in collected], dtype=np.float64)
        shares = np.array([share for _, share in collected], dtype=np.float64)
        if key == "tokens":
            combined[key] = float(values.sum())
        elif key.endswith("_max") or key.endswith("/max"):
            combined[key] = float(values.max())
        else:
            combined[key] = float((values * shares).sum() / total_share)
    return combined


SUMMED_STEP_METRICS = ("tokens", LOSS_SCALE_SKIPS)
"""Optimizer-step metrics that add up over a rollout batch (the rest are averaged or, for maxima, maxed)."""
FIRST_STEP_PREFIXES = ("mismatch/", "rollout_corr/")
"""Metrics also reported for the first optimizer step alone (``mismatch/first_*``, ``rollout_corr/first_*``): before
any update on the batch, π_θ there is the rollout weights' π_θ', so |π − μ| and the k3/χ² diagnostics are the
engine's mismatch with no staleness from earlier minibatches in it (what verl's trainer logs as ``rollout_corr/*``)."""


def summarize_steps(history: Sequence[dict[str, float]], max_keys: Sequence[str] = ()) -> dict[str, float]:
    """Optimizer-step metrics of one rollout batch → one number each: maxima (``*max`` and ``max_keys``) by max,
    :data:`SUMMED_STEP_METRICS` summed, everything else averaged, each over the steps that report it (a skipped step has
    no gradient norm); ``mismatch/*`` and ``rollout_corr/*`` of the first step also as ``mismatch/first_*`` and
    ``rollout_corr/first_*``."""
    keys = list(dict.fromkeys(key for step in history for key in step))
    summary = {}
    for key in keys:
        values = np.array([step[key] for step in history if key in step], dtype=np.float64)
        if key.endswith("max") or key in max_keys:
            summary[key] = float(values.max())
        elif key in SUMMED_STEP_METRICS:
            summary[key] = float(values.sum())
        else:
            summary[key] = float(values.mean())
    if history:
        summary.update({prefix + "first_" + key[len(prefix):]: float(value)
                        for key, value in history[0].items() for prefix in FIRST_STEP_PREFIXES
                        if key.startswith(prefix)})
    return summary
