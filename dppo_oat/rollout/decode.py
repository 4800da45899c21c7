"""A plain sampling loop over a Hugging Face causal LM with its KV cache: the fast path of the HF generator.

``model.generate`` spends a good part of each step of a small model on machinery a rollout does not use (logits
processors, stopping criteria, score bookkeeping). For untruncated sampling at a temperature > 0 — every training
rollout — the loop below does only what the rollout needs: one forward per token on the cache, ``log_softmax`` of
``logits / temperature`` (μ exactly, the distribution the token is drawn from), one ``torch.multinomial`` draw, and
log μ(a_t); when asked, μ's whole log-probs, from which the generator takes ``TopK(μ, K) ∪ {a_t}``. Left-padded
prompts get position ids from their attention mask, as ``generate`` gives them; rows that have stopped receive the
pad token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Decoded:
    """The sampled continuation of a batch: ``new_ids [B, T]`` (pad after a row's stop token), ``logprobs [B, T, V]``
    of μ at every step (only when ``keep_logprobs``) and ``action_logprobs [B, T]``."""

    new_ids: torch.Tensor
    action_logprobs: torch.Tensor
    logprobs: torch.Tensor | None


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (pads get 1, as ``generate`` does)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)


@torch.inference_mode()
def sample_with_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                      temperature: float, stop_ids: torch.Tensor, pad_id: int, keep_logprobs: bool) -> Decoded:
    """Sample up to ``max_new_tokens`` tokens per row from ``softmax(logits / temperature)``; a row stops after its
    first token in ``stop_ids``. The caller seeds torch's RNG."""
    if not temperature > 0:
        raise ValueError(f"the sampling loop needs a temperature > 0, got {temperature}")
    positions = left_padded_positions(attention_mask)
    output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True)
    cache, logits = output.past_key_values, output.logits[:, -1]
    next_position = positions[:, -1:] + 1
    stopped = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    tokens, action_logprobs, all_logprobs = [], [], []
    for step in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = torch.multinomial(logprobs.exp(), num_samples=1).squeeze(-1)
        token = torch.where(stopped, torch.full_like(token, pad_id), token)
        tokens.append(token)
        action_logprobs.append(logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1))
        if keep_logprobs:
            all_logprobs.append(logprobs)
        stopped |= torch.isin(token, stop_ids)
        if bool(stopped.all()) or step == max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        output = model(input_ids=token.unsqueeze(-1), attention_mask=attention_mask, position_ids=next_position,
                       past_key_values=cache, use_cache=True)
        cache, logits, next_position = output.past_key_values, output.logits[:, -1], next_position + 1
    return Decoded(torch.stack(tokens, dim=1), torch.stack(action_logprobs, dim=1),
                   torch.stack(all_logprobs, dim=1) if keep_logprobs else None)
