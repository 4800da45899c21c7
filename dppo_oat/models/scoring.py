"""Teacher-forced log-probs: the reference a generator's μ must reproduce."""

from __future__ import annotations

from typing import Sequence

import torch


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
    for prompt, completion in zip(prompts, completions):
        reference = teacher_forced_logprobs(model, prompt, completion.token_ids, temperature=temperature, top_p=top_p)
        expected = reference.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(completion.logprobs)).abs().max().item())
    return worst
