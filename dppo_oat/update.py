"""The policy update: one rollout batch → epochs × minibatches of ``policy_loss`` steps.

Written once, for every engine: the model's forward pass, the backward pass and the optimizer step are parameters,
so the local engine passes a plain torch model and optimizer while the oat engine passes oat's DeepSpeed strategy.

Per rollout batch (as in PPO with several updates per rollout):
1. if the trust region is anchored on π_θ' (``minirl``, ``*_recompute``), recompute π_θ'(a_t) once, without grad;
2. for each of ``num_epochs`` epochs, shuffle and split into minibatches; each minibatch is one optimizer step,
   accumulated over micro-batches: forward (fp32 log-probs, entropy, top-K gather) → :func:`policy_loss` →
   aggregation → backward; then the optimizer step (with gradient clipping inside ``optimizer_step``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from dppo_oat.aggregation import aggregate_loss
from dppo_oat.logprobs import entropy_chunked, gather_logprobs_chunked
from dppo_oat.samples import UpdateBatch
from dppo_oat.spec import UpdateSettings
from dppo_oat.trust_region import TopK, TrustRegion, policy_loss


@dataclass
class PolicyOutputs:
    """What a forward pass returns, aligned like :class:`UpdateBatch` per-token fields."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    topk_logp: torch.Tensor | None = None


ForwardFn = Callable[[UpdateBatch, bool], PolicyOutputs]
"""``forward(batch, with_topk) -> PolicyOutputs``; ``logp`` carries gradient."""


def causal_lm_forward(model, *, chunk_size: int = 1024, with_entropy: bool = True) -> ForwardFn:
    """A :data:`ForwardFn` for any Hugging Face causal LM: fp32 log-probs of the predicted tokens, entropy and the
    top-K gather computed in chunks (no ``[N, L, V]`` log-softmax is kept)."""

    def forward(batch: UpdateBatch, with_topk: bool) -> PolicyOutputs:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        logp = gather_logprobs_chunked(logits, batch.input_ids[:, 1:], chunk_size=chunk_size)
        entropy = topk_logp = None
        with torch.no_grad():
            if with_entropy:
                entropy = entropy_chunked(logits.detach(), chunk_size=chunk_size)
            if with_topk:
                topk_logp = gather_logprobs_chunked(logits.detach(), batch.topk_ids, chunk_size=chunk_size)
        return PolicyOutputs(logp=logp, entropy=entropy, topk_logp=topk_logp)

    return forward


BackwardFn = Callable[[torch.Tensor], None]
OptimizerStepFn = Callable[[], "dict[str, float] | None"]


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
) -> list[dict[str, float]]:
    """All optimizer steps of one rollout batch; returns one metrics dict per step."""
    micro = settings.micro_batch_size or settings.minibatch_size
    if tr.needs_recompute and batch.recomputed_logp is None:
        batch = replace(batch, recomputed_logp=recompute_logprobs(batch, forward, micro))
    if tr.uses_topk and batch.topk_ids is None:
        raise ValueError(f"trust region {tr.name!r} needs the rollout's top-K set (generate with top_k_logprobs=K)")
    history = []
    for epoch in range(settings.num_epochs):
        for index in minibatch_indices(len(batch), settings.minibatch_size, generator):
            metrics = minibatch_step(batch, index, tr, forward, backward, settings)
            metrics.update(optimizer_step() or {})
            metrics["epoch"] = float(epoch)
            history.append(metrics)
            if on_step is not None:
                on_step()
    return history


def minibatch_step(batch, index, tr, forward, backward, settings: UpdateSettings) -> dict[str, float]:
    """Forward + loss + backward over the micro-batches of one minibatch (gradients accumulate)."""
    micro_size = settings.micro_batch_size or len(index)
    totals = _micro_denominators(batch.response_mask[index], settings.aggregation)
    collected = []
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
        backward(loss * share if settings.scale_micro_batches else loss)
        metrics = dict(result.metrics, loss=loss.item())
        if out.entropy is not None:
            metrics["entropy"] = _masked_mean(out.entropy, micro.response_mask)
        collected.append((metrics, share))
    return combine_micro_metrics(collected)


def _micro_denominators(response_mask: torch.Tensor, aggregation: str) -> float:
    """What the aggregation divides by: tokens (``token-mean``) or sequences with a response token."""
    if aggregation == "token-mean":
        return float(response_mask.sum().clamp(min=1).item())
    return float((response_mask.sum(-1) > 0).sum().clamp(min=1).item())


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.bool()
    return float(values[mask].float().mean().item()) if mask.any() else 0.0


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


def summarize_steps(history: Sequence[dict[str, float]], max_keys: Sequence[str] = ()) -> dict[str, float]:
    """Optimizer-step metrics of one rollout batch → one number each: maxima (``*max`` and ``max_keys``) by max,
    ``tokens`` summed, everything else averaged."""
    summary = {}
    for key in history[0]:
        values = np.array([step[key] for step in history], dtype=np.float64)
        if key.endswith("max") or key in max_keys:
            summary[key] = float(values.max())
        elif key == "tokens":
            summary[key] = float(values.sum())
        else:
            summary[key] = float(values.mean())
    return summary
