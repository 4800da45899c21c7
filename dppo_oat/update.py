"""The policy update: one rollout batch → epochs × minibatches of ``policy_loss`` steps.

Written once, for every engine: the model's forward pass, the backward pass and the optimizer step are parameters,
so the local engine passes a plain torch model and optimizer while the oat engine passes oat's DeepSpeed strategy.

Per rollout batch (as in PPO with several updates per rollout):
1. if the trust region reads π_θ' (``minirl``, ``*_recompute``, the mismatch presets), recompute π_θ'(a_t) once,
   without grad;
2. for each of ``num_epochs`` epochs, shuffle and split into minibatches; each minibatch is one optimizer step,
   accumulated over micro-batches: forward (fp32 log-probs, entropy, top-K gather) → :func:`policy_loss` →
   aggregation → backward; then the optimizer step (with gradient clipping inside ``optimizer_step``).

π_θ is the distribution the rollout sampled from: the forward pass divides the logits by the sampling temperature,
as the rollout engine did before reporting μ (``causal_lm_forward(settings=...)`` reads ``settings.temperature``;
:class:`~dppo_oat.spec.RunSpec` refuses a learner temperature other than the sampling one). It takes π_θ from the last hidden states through the fused
LM head (:mod:`dppo_oat.fused_head`), which never holds the ``[N, V]`` logits and, told the loss, computes its
gradients in the same pass; the head runs on the response tokens only (:func:`response_positions`).

The divergence guard (:class:`DivergenceGuard`): a minibatch whose loss or μ log-probs are non-finite is never
applied (its backward is a zero-gradient surrogate, so engines that count micro-batches stay aligned, and the engine
discards the step); an engine whose gradient norm is non-finite skips its step and says so (``guard/skipped``). A
run that skips ``patience`` optimizer steps in a row, or whose own log-probs turn non-finite, stops with
:class:`~dppo_oat.errors.TrainingDiverged`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from dppo_oat.aggregation import aggregate_loss
from dppo_oat.errors import TrainingDiverged
from dppo_oat.fused_head import FusedHeadUnsupported, TokenGrad, fused_head_logprobs, head_of, last_hidden_states
from dppo_oat.logprobs import DEFAULT_CHUNK_SIZE, logits_logprobs
from dppo_oat.runlog import nonfinite_tensors
from dppo_oat.samples import UpdateBatch
from dppo_oat.spec import UpdateSettings
from dppo_oat.token_samples import TokenSampler
from dppo_oat.trust_region import TopK, TrustRegion, masked_mean, policy_loss


@dataclass
class PolicyOutputs:
    """What a forward pass returns, aligned like :class:`UpdateBatch` per-token fields."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    topk_logp: torch.Tensor | None = None


ForwardFn = Callable[[UpdateBatch, bool], PolicyOutputs]
"""``forward(batch, with_topk) -> PolicyOutputs``; ``logp`` carries gradient."""


LM_HEADS = ("fused", "logits")
"""How the learner gets π_θ from the model: ``fused`` (from the last hidden states and the head weight, chunk by
chunk: :mod:`dppo_oat.fused_head`) or ``logits`` (from the model's ``[N, V]`` logits, for comparison)."""


def causal_lm_forward(model, *, settings: UpdateSettings | None = None, trust_region: TrustRegion | None = None,
                      chunk_size: int | None = None, with_entropy: bool = True, lm_head: str = "fused") -> ForwardFn:
    """A :data:`ForwardFn` for any Hugging Face causal LM (or a wrapper of one): fp32 log-probs of the predicted
    tokens, entropy and the top-K gather, all of ``softmax(logits / T)`` at the update's temperature
    ``T = settings.temperature`` (the sampling temperature, :class:`~dppo_oat.spec.RunSpec`): the distribution a
    rollout at that temperature samples from. Without ``settings``, T = 1 (the model's own distribution).

    ``lm_head="fused"`` never holds the ``[N, V]`` logits (:func:`~dppo_oat.fused_head.fused_head_logprobs`); a model
    whose head it cannot reproduce (:func:`~dppo_oat.fused_head.head_of`) takes the ``logits`` path, with a warning.
    Given the update's ``trust_region`` and ``settings``, the fused head computes the gradients of
    :func:`minibatch_step`'s loss in the forward pass (:func:`announced_token_grad`). ``chunk_size``: token rows per
    chunk (default: 128 MiB of fp32 logits on the fused head, 1,024 rows on the logits path).
    """
    temperature = 1.0 if settings is None else settings.temperature
    if lm_head not in LM_HEADS:
        raise ValueError(f"unknown lm_head {lm_head!r}; choose one of: {', '.join(LM_HEADS)}")
    fused = lm_head == "fused" and fused_head_available(model)

    def forward(batch: UpdateBatch, with_topk: bool) -> PolicyOutputs:
        positions = response_positions(batch)
        ids = batch.input_ids[:, 1:].reshape(-1)[positions]
        topk_ids = batch.topk_ids.reshape(-1, batch.topk_ids.shape[-1])[positions] if with_topk else None
        options = dict(temperature=temperature, topk_ids=topk_ids, with_entropy=with_entropy)
        if fused:
            hidden = response_rows(last_hidden_states(model, batch.input_ids, batch.attention_mask), positions)
            announced = announced_token_grad(batch, trust_region, settings) if trust_region and settings else None
            logp, entropy, topk_logp = fused_head_logprobs(hidden, head_of(model).weight, ids, chunk_size=chunk_size,
                                                           token_grad=at_positions(announced, positions), **options)
        else:
            logits = response_rows(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                   positions)
            logp, entropy, topk_logp = logits_logprobs(logits, ids, chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
                                                       **options)
        return on_response_positions(batch, positions, logp, entropy, topk_logp)

    return forward


def response_positions(batch: UpdateBatch) -> torch.Tensor:
    """Flat indices (of ``[B, L−1]``) of the response tokens: the only positions a loss or a metric reads, so the
    LM head and its softmax run on them alone (prompts are most of a multi-turn batch's tokens)."""
    return batch.response_mask.reshape(-1).nonzero().squeeze(-1)


def response_rows(states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[M, D]`` rows of ``states [B, L, D]`` that predict the response tokens ``positions`` of ``[B, L−1]``."""
    return states[:, :-1].reshape(-1, states.shape[-1])[positions]


def at_positions(token_grad: TokenGrad | None, positions: torch.Tensor) -> TokenGrad | None:
    """``token_grad`` (rows of the flattened ``[B, L−1]``) for rows that index ``positions`` instead."""
    if token_grad is None:
        return None
    return lambda rows, logp, topk_logp: token_grad(positions[rows], logp, topk_logp)


def on_response_positions(batch: UpdateBatch, positions: torch.Tensor, logp: torch.Tensor,
                          entropy: torch.Tensor | None, topk_logp: torch.Tensor | None) -> PolicyOutputs:
    """The response tokens' values laid out like ``batch``'s per-token fields; elsewhere π takes μ's values (ratio 1,
    divergence 0) and the entropy 0, so that no rule or metric reads anything there even unmasked."""

    def laid_out(values: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        flat = base.detach().to(values.dtype).reshape(-1, *values.shape[1:])
        return flat.index_copy(0, positions, values).reshape(base.shape)

    mu = batch.behavior_logp
    return PolicyOutputs(
        logp=laid_out(logp, mu),
        entropy=None if entropy is None else laid_out(entropy, torch.zeros_like(mu, dtype=entropy.dtype)),
        topk_logp=None if topk_logp is None else laid_out(topk_logp, batch.topk_behavior_logp),
    )


def announced_token_grad(micro: UpdateBatch, tr: TrustRegion, settings: UpdateSettings) -> TokenGrad:
    """``g_t = ∂L/∂ log π_θ(a_t)`` of some token rows (of ``[B, T]`` flattened), ``L`` being the loss
    :func:`minibatch_step` takes on ``micro`` (:func:`policy_loss`, then :func:`aggregate_loss`). The other tokens are
    set to μ: every rule's loss is a sum over tokens, each a function of its own log π_θ(a_t) (eq:unified_grad)."""
    mu = micro.behavior_logp.detach().float()

    def token_grad(rows: slice, logp: torch.Tensor, topk_logp: torch.Tensor | None) -> torch.Tensor:
        with torch.enable_grad():
            full = mu.clone().reshape(-1)
            full[rows] = logp
            full = full.reshape(mu.shape).requires_grad_()
            topk = None
            if tr.uses_topk:
                top = micro.topk_behavior_logp.detach().float().clone()
                top.reshape(-1, top.shape[-1])[rows] = topk_logp
                topk = TopK(micro.topk_ids, micro.topk_behavior_logp, top, micro.topk_valid)
            result = policy_loss(full, micro.behavior_logp, micro.advantages, micro.response_mask, tr,
                                 recomputed_logp=micro.recomputed_logp, topk=topk, with_metrics=False)
            loss = aggregate_loss(result.loss, micro.response_mask, settings.aggregation,
                                  norm_constant=settings.norm_constant)
            (grad,) = torch.autograd.grad(loss, full)
        return grad.reshape(-1)[rows]

    return token_grad


def fused_head_available(model) -> bool:
    """True when the fused head computes exactly the model's logits' log-probs; else warn once, saying why."""
    try:
        head_of(model)
    except FusedHeadUnsupported as reason:
        warnings.warn(f"the learner takes the logits path: {reason}", stacklevel=3)
        return False
    return True


BackwardFn = Callable[[torch.Tensor], None]
OptimizerStepFn = Callable[[], "dict[str, float] | None"]
"""Applies the minibatch's accumulated gradients. Must not apply a non-finite gradient: then it discards it and
returns ``{SKIPPED: 1.0}`` among its metrics."""
DiscardStepFn = Callable[[], "dict[str, float] | None"]
"""Drops the minibatch's accumulated gradients without changing the weights (the guard's skip)."""

SKIPPED = "guard/skipped"
"""1.0 for an optimizer step that was not applied (non-finite loss, μ log-probs or gradients), else 0.0."""
NONFINITE_PI = "guard/nonfinite_pi"
"""π_θ's own log-probs non-finite: the weights diverged, and nothing later can recover."""
NONFINITE_CAUSES = {"guard/nonfinite_loss": "the policy loss", "guard/nonfinite_mu": "μ's log-probs (the rollout's)",
                    "guard/nonfinite_grad": "the gradient norm", NONFINITE_PI: "π_θ's log-probs"}
"""The guard's per-step metrics (1.0 when that value was non-finite) and what each names in an error."""

HEALTHY, SKIP, DIVERGED = 0, 1, 2
"""The state of a minibatch (or of the weights after an update), ordered so that the worst one wins."""

AnyLearner = Callable[[int], int]
"""The largest of one value over every learner (an all-reduce MAX over oat's ranks; one learner: the value itself).
Every decision that is followed by a collective or by the end of the run (step, skip, stop) is taken on the agreed
state, so that no learner goes on alone into a collective the others never reach, which would hang until the
communication timeout."""


def one_learner(state: int) -> int:
    """:data:`AnyLearner` of a single learner (the local engine)."""
    return state


def where(here: bool) -> str:
    """Where a learner's error happened, for its message: nothing for this learner, else on another one."""
    return "" if here else " on another learner"


def diverged_error(here: bool) -> TrainingDiverged:
    """The stop of a run whose weights diverged, on this learner or on another one."""
    return TrainingDiverged(f"π_θ's log-probs are non-finite{where(here)}: the policy's weights diverged (lower --lr "
                            "and start a new run from the last checkpoint's settings)")


@dataclass
class DivergenceGuard:
    """Counts optimizer steps skipped in a row; ``patience`` of them stop the run (it will not recover)."""

    patience: int = 8
    skipped_in_a_row: int = 0
    skipped_total: int = 0

    def observe(self, metrics: dict[str, float]) -> None:
        """Record one optimizer step's metrics; raise :class:`TrainingDiverged` after ``patience`` skips in a row."""
        if not metrics.get(SKIPPED):
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        self.skipped_total += 1
        if self.skipped_in_a_row >= self.patience:
            causes = [name for key, name in NONFINITE_CAUSES.items() if metrics.get(key)] or ["a value"]
            raise TrainingDiverged(
                f"{' and '.join(causes)} non-finite in {self.skipped_in_a_row} optimizer steps in a row (none was "
                "applied): lower --lr, check the rollout's log-probs (--logprob-noise?) and start a new run")


def nonfinite_cause(logp: torch.Tensor, behavior_logp: torch.Tensor, loss: torch.Tensor,
                    response_mask: torch.Tensor, topk: TopK | None = None) -> str | None:
    """Which guard metric a micro-batch trips (None: all finite). Non-finite π_θ log-probs (:data:`NONFINITE_PI`)
    mean the weights themselves diverged: the minibatch ends the run once every learner has finished it (see
    :func:`finish_minibatch`). μ on the top-K set may be −inf (its padding slots, an underflowed tail token), never
    NaN."""
    mask = response_mask.bool()
    if not torch.isfinite(logp.detach()[mask]).all():
        return NONFINITE_PI
    if not torch.isfinite(behavior_logp[mask]).all():
        return "guard/nonfinite_mu"
    if topk is not None and torch.isnan(topk.behavior_logp[mask]).any():
        return "guard/nonfinite_mu"
    if not torch.isfinite(loss.detach()).all():
        return "guard/nonfinite_loss"
    return None


def zero_surrogate(logp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is exactly zero but which runs the same backward, collectives included (with
    non-finite π_θ log-probs the gradient is not finite either: the minibatch is discarded all the same)."""
    return (logp * response_mask).sum() * 0.0


def clip_and_step(parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                  max_grad_norm: float) -> dict[str, float]:
    """A plain torch :data:`OptimizerStepFn`: clip the gradient norm, step unless it is non-finite, zero grads."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm))
    applied = math.isfinite(grad_norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": grad_norm, **({} if applied else {SKIPPED: 1.0, "guard/nonfinite_grad": 1.0})}


@torch.no_grad()
def check_policy_finite(batch: UpdateBatch, forward: ForwardFn, rows: int = 4,
                        any_learner: AnyLearner = one_learner) -> None:
    """After an update: π_θ's log-probs on the first ``rows`` samples are finite on every learner, or the weights
    diverged (every learner raises), before any checkpoint of them is written."""
    first = batch.select(torch.arange(min(rows, len(batch))))
    logp = forward(first, False).logp
    here = not torch.isfinite(logp[first.response_mask.bool()]).all()
    if any_learner(DIVERGED if here else HEALTHY) == DIVERGED:
        raise TrainingDiverged(f"the update left π_θ's log-probs non-finite{where(here)}: the weights diverged (lower "
                               "--lr and start a new run)")


def check_weights_finite(named_weights: Iterable[tuple[str, torch.Tensor]],
                         any_learner: AnyLearner = one_learner) -> None:
    """Every weight (each learner's own shard of it) is finite on every learner, or every learner raises: run
    before weights are saved or sent to the rollout engine, so that neither ever holds a NaN."""
    broken = nonfinite_tensors(dict(named_weights))
    if any_learner(DIVERGED if broken else HEALTHY) == DIVERGED:
        named = f" (e.g. {broken[0]})" if broken else where(False)
        raise TrainingDiverged(f"weights are non-finite{named}: the update diverged (lower --lr and start a new run)")


@torch.no_grad()
def recompute_logprobs(batch: UpdateBatch, forward: ForwardFn, micro_batch_size: int) -> torch.Tensor:
    """log π_θ'(a_t) of the current (rollout) weights, before any update: the anchor of ``minirl``/``*_recompute``."""
    out = torch.zeros_like(batch.behavior_logp, dtype=torch.float32)
    for index in torch.arange(len(batch)).split(micro_batch_size):
        logp = forward(batch.select(index), False).logp
        out[index, : logp.shape[1]] = logp.float()
    return out


def minibatch_indices(num_rows: int, minibatch_size: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    """A random permutation of the rows, split into minibatches (the last one may be smaller)."""
    return list(torch.randperm(num_rows, generator=generator).split(minibatch_size))


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
    guard: DivergenceGuard | None = None,
    token_sampler: TokenSampler | None = None,
    any_learner: AnyLearner = one_learner,
) -> list[dict[str, float]]:
    """All optimizer steps of one rollout batch; returns one metrics dict per step.

    ``discard_step`` lets the guard skip a minibatch with a non-finite loss or μ (without it such a minibatch stops
    the run at once); ``guard`` carries the count of skips in a row across rollout batches; ``token_sampler`` sees
    every token of the first epoch with π_θ of its forward pass (the ``tokens.jsonl`` sample); ``any_learner``
    agrees every step, skip and stop with the other learners (:data:`AnyLearner`).
    """
    guard = guard or DivergenceGuard()
    micro = settings.micro_batch_size or settings.minibatch_size
    if tr.needs_recompute and batch.recomputed_logp is None:
        batch = replace(batch, recomputed_logp=recompute_logprobs(batch, forward, micro))
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


def minibatch_state(poisoned: Sequence[str]) -> int:
    """:data:`DIVERGED` when π_θ itself is non-finite, :data:`SKIP` for any other guard metric, else
    :data:`HEALTHY`."""
    if NONFINITE_PI in poisoned:
        return DIVERGED
    return SKIP if poisoned else HEALTHY


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
        raise diverged_error(here=NONFINITE_PI in poisoned)
    if discard_step is None:
        cause = NONFINITE_CAUSES[poisoned[0]] if poisoned else "a value on another learner"
        raise TrainingDiverged(f"{cause} non-finite, and this engine cannot skip a step")
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
        loss = aggregate_loss(result.loss, micro.response_mask, settings.aggregation, norm_constant=settings.norm_constant)
        share = _micro_denominators(micro.response_mask, settings.aggregation) / totals
        cause = nonfinite_cause(out.logp, micro.behavior_logp, loss, micro.response_mask, topk)
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


FIRST_STEP_PREFIX = "mismatch/"
"""Metrics also reported for the first optimizer step alone (``mismatch/first_*``): before any update on the batch,
|π − μ| there is the engine's mismatch with no staleness from earlier minibatches in it."""


def summarize_steps(history: Sequence[dict[str, float]], max_keys: Sequence[str] = ()) -> dict[str, float]:
    """Optimizer-step metrics of one rollout batch → one number each: maxima (``*max`` and ``max_keys``) by max,
    ``tokens`` summed, everything else averaged, each over the steps that report it (a skipped step has no
    gradient norm); ``mismatch/*`` of the first step also as ``mismatch/first_*``."""
    keys = list(dict.fromkeys(key for step in history for key in step))
    summary = {}
    for key in keys:
        values = np.array([step[key] for step in history if key in step], dtype=np.float64)
        if key.endswith("max") or key in max_keys:
            summary[key] = float(values.max())
        elif key == "tokens":
            summary[key] = float(values.sum())
        else:
            summary[key] = float(values.mean())
    if history:
        summary.update({FIRST_STEP_PREFIX + "first_" + key[len(FIRST_STEP_PREFIX):]: float(value)
                        for key, value in history[0].items() if key.startswith(FIRST_STEP_PREFIX)})
    return summary
