"""How close the binary and top-K divergences come to the exact one on real batches (sec:method_large_vocab).

The paper's binary and top-K divergences are cheap lower bounds of the full-vocabulary divergence
(app:divergence_lower_bounds). A probe makes the comparison on a rollout batch: the full next-token distributions of
the behavior policy μ (the rollout model, before the step's updates) and of π_θ (after them) at every response
token, and from them the three estimates of D_TV and D_KL, their means and how often each exceeds δ (how often it
would mask). It needs the full logits of both policies, so it runs in engines that hold the rollout model in the
same process (the local engine, every ``--probe-every`` steps).
"""

from __future__ import annotations

import torch

from dppo_oat.divergence.estimates import binary_kl, binary_tv, exact_kl, exact_tv, topk_kl, topk_tv
from dppo_oat.divergence.logprobs import topk_of_logprobs
from dppo_oat.update_batch import TOPK_PAD_ID, UpdateBatch


@torch.no_grad()
def response_logits(model, batch: UpdateBatch, micro_batch_size: int = 64, temperature: float = 1.0) -> torch.Tensor:
    """``[n, V]`` fp32 next-token logits of ``model`` at the ``n`` response tokens of ``batch`` (in row order),
    divided by the sampling ``temperature`` (the distribution the rollout sampled from). A measurement: no autograd
    graph is kept (it would hold every micro-batch's activations until the probe ends)."""
    chunks = []
    for index in torch.arange(len(batch), device=batch.input_ids.device).split(micro_batch_size):
        rows = batch.select(index)
        logits = model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits[:, :-1].float()
        chunks.append(logits[rows.response_mask.bool()] / temperature)
    return torch.cat(chunks)


def response_actions(batch: UpdateBatch) -> torch.Tensor:
    """``[n]`` sampled token ids a_t at the response tokens of ``batch``, aligned with :func:`response_logits`."""
    return batch.input_ids[:, 1:][batch.response_mask.bool()]


def divergence_estimates(behavior_logits: torch.Tensor, logits: torch.Tensor, actions: torch.Tensor,
                         k: int) -> dict[str, torch.Tensor]:
    """Per-token binary (eq:binary_tv, eq:binary_kl), top-K over TopK(μ, K) ∪ {a_t} (eq:topk_tv, eq:topk_kl) and
    exact D_TV / D_KL between μ (``behavior_logits``) and π (``logits``), each ``[n]``, keyed ``"{estimate}_{tv|kl}"``.
    """
    mu_logp = torch.log_softmax(behavior_logits.float(), dim=-1)
    pi_logp = torch.log_softmax(logits.float(), dim=-1)
    mu_action = mu_logp.gather(-1, actions[:, None]).squeeze(-1)
    pi_action = pi_logp.gather(-1, actions[:, None]).squeeze(-1)
    topk_ids, mu_topk = topk_of_logprobs(mu_logp, actions, k)
    valid = topk_ids != TOPK_PAD_ID
    pi_topk = pi_logp.gather(-1, torch.where(valid, topk_ids, torch.zeros_like(topk_ids)))
    pi_topk = torch.where(valid, pi_topk, torch.full_like(pi_topk, float("-inf")))
    return {
        "binary_tv": binary_tv(mu_action, pi_action),
        "topk_tv": topk_tv(mu_topk, pi_topk, valid),
        "exact_tv": exact_tv(behavior_logits, logits),
        "binary_kl": binary_kl(mu_action, pi_action),
        "topk_kl": topk_kl(mu_topk, pi_topk, valid),
        "exact_kl": exact_kl(behavior_logits, logits),
    }


def probe_metrics(estimates: dict[str, torch.Tensor], delta: float) -> dict[str, float]:
    """``probe/{name}_mean``, ``probe/{name}_max`` and ``probe/{name}_above_delta`` (fraction of tokens with D > δ)
    for every estimate (how much a bound misses is the ratio of means, taken over many probes by the analysis)."""
    metrics = {}
    for name, values in estimates.items():
        values = values.double()
        metrics[f"probe/{name}_mean"] = float(values.mean()) if values.numel() else 0.0
        metrics[f"probe/{name}_max"] = float(values.max()) if values.numel() else 0.0
        metrics[f"probe/{name}_above_delta"] = float((values > delta).double().mean()) if values.numel() else 0.0
    return metrics

