"""Teacher-forced log-probs: the reference a generator's μ must reproduce."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dppo_oat.update_batch import TOPK_PAD_ID


def nucleus_log_softmax(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``log_softmax`` restricted to the nucleus: the smallest most-likely set with mass >= ``top_p`` (rest -inf)."""
    if top_p >= 1:
        return torch.log_softmax(logits, dim=-1)
    probs = logits.softmax(dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = torch.zeros_like(sorted_probs, dtype=torch.bool).scatter(-1, order, mass_before < top_p)
    return torch.log_softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)


def teacher_forced_logprobs(
    model, prompt: Sequence[int], completion: Sequence[int], *, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """``[T, V]`` fp32 log-probs of the sampling distribution at every completion position, one unpadded forward."""
    ids = torch.tensor([list(prompt) + list(completion)], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return nucleus_log_softmax(logits, top_p).cpu()


def max_logprob_error(model, prompts, completions, *, temperature: float = 1.0, top_p: float = 1.0) -> float:
    """Largest |reported log μ(a_t) − teacher-forced log μ(a_t)| over every token of every completion."""
    worst = 0.0
    for prompt, completion in zip(prompts, completions, strict=True):
        reference = teacher_forced_logprobs(model, prompt, completion.token_ids, temperature=temperature, top_p=top_p)
        expected = reference.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(completion.logprobs)).abs().max().item())
    return worst


def check_topk_set(reference: torch.Tensor, completion, k: int, *, atol: float = 1e-4) -> int:
    """Check a completion's top-K arrays against ``reference`` (``[T, V]`` teacher-forced log-probs of the sampling
    distribution): the first K slots are μ's K most likely tokens with their log-probs, the last slot holds a_t
    exactly when a_t is outside them (else padding). Raises ``ValueError`` on the first violation; returns how many
    positions had a_t outside the top K."""
    expected = (len(completion.token_ids), k + 1)
    if completion.topk_ids.shape != expected or completion.topk_logprobs.shape != expected:
        raise ValueError(f"top-K arrays have shape {completion.topk_ids.shape}, expected {expected}")
    outside = 0
    for t, action in enumerate(completion.token_ids):
        ids, logprobs = completion.topk_ids[t], completion.topk_logprobs[t]
        best = torch.topk(reference[t], k).indices.tolist()
        if set(ids[:k].tolist()) != set(best):
            raise ValueError(f"position {t}: top-{k} ids {sorted(ids[:k].tolist())} != {sorted(best)}")
        if (reference[t, ids[:k]] - torch.as_tensor(logprobs[:k])).abs().max() > atol:
            raise ValueError(f"position {t}: top-K log-probs differ from the reference by more than {atol}")
        if action in best:
            if ids[k] != TOPK_PAD_ID or logprobs[k] != float("-inf"):
                raise ValueError(f"position {t}: a_t is in the top K but the extra slot is used")
        else:
            outside += 1
            if ids[k] != action or abs(logprobs[k] - completion.logprobs[t]) > 1e-6:
                raise ValueError(f"position {t}: a_t={action} outside the top K is not in the extra slot")
    return outside
