"""The learner's forward pass: π_θ's fp32 log-probs, entropy and top-K gather on a batch's response tokens, the
:data:`ForwardFn` the update loop (:mod:`dppo_oat.learner.update`) is given.

π_θ is the distribution the rollout sampled from: the forward pass divides the logits by the sampling temperature,
as the rollout engine did before reporting μ (``causal_lm_forward(settings=...)`` reads ``settings.temperature``;
:class:`~dppo_oat.settings.spec.RunSpec` refuses a learner temperature other than the sampling one). It takes π_θ from
the last hidden states through the fused LM head (:mod:`dppo_oat.learner.fused_head`), which never holds the ``[N, V]``
logits, in the forward pass or the backward (eq:unified_grad); the head runs on the response tokens only
(:func:`response_positions`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dppo_oat.divergence.logprobs import DEFAULT_CHUNK_SIZE, logits_logprobs
from dppo_oat.learner.fused_head import FusedHeadUnsupported, fused_head_logprobs, head_of, last_hidden_states
from dppo_oat.settings.spec import UpdateSettings
from dppo_oat.update_batch import UpdateBatch


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
chunk: :mod:`dppo_oat.learner.fused_head`) or ``logits`` (from the model's ``[N, V]`` logits, for comparison)."""


def causal_lm_forward(model, *, settings: UpdateSettings | None = None, chunk_size: int | None = None,
                      with_entropy: bool = True, lm_head: str = "fused") -> ForwardFn:
    """A :data:`ForwardFn` for any Hugging Face causal LM (or a wrapper of one): fp32 log-probs of the predicted
    tokens, entropy and the top-K gather, all of ``softmax(logits / T)`` at the update's temperature
    ``T = settings.temperature`` (the sampling temperature, :class:`~dppo_oat.settings.spec.RunSpec`): the distribution
    a rollout at that temperature samples from. Without ``settings``, T = 1 (the model's own distribution).

    ``lm_head="fused"`` never holds the ``[N, V]`` logits (:func:`~dppo_oat.learner.fused_head.fused_head_logprobs`); a
    model whose head it cannot reproduce (:func:`~dppo_oat.learner.fused_head.head_of`) takes the ``logits`` path, with
    a warning. ``chunk_size``: token rows per chunk (default: 128 MiB of fp32 logits on the fused head, 1,024 rows on
    the logits path).
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
            logp, entropy, topk_logp = fused_head_logprobs(hidden, head_of(model).weight, ids, chunk_size=chunk_size,
                                                           **options)
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


def fused_head_available(model) -> bool:
    """True when the fused head computes exactly the model's logits' log-probs; else warn once, saying why."""
    try:
        head_of(model)
    except FusedHeadUnsupported as reason:
        warnings.warn(f"the learner takes the logits path: {reason}", stacklevel=3)
        return False
    return True
