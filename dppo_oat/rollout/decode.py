"""A plain sampling loop over a Hugging Face causal LM with its KV cache: the fast path of the HF generator.

``model.generate`` spends a good part of each step of a small model on machinery a rollout does not use (logits
processors, stopping criteria, score bookkeeping). For untruncated sampling at a temperature > 0 — every training
rollout — the loop below does only what the rollout needs: one forward per token on the cache, ``log_softmax`` of
``logits / temperature`` (μ exactly, the distribution the token is drawn from), one draw by inverting its
cumulative sum (:func:`inverse_cdf_sample`, cheaper than ``torch.multinomial``), and log μ(a_t); when asked, μ's
whole log-probs, from which the generator takes ``TopK(μ, K) ∪ {a_t}``. Left-padded prompts get position ids from
their attention mask, as ``generate`` gives them; rows that have stopped receive the pad token.

The prefill spares two kinds of work, as vLLM's does: the tokens every prompt of the batch starts with (a chat
template's system prompt, a game's header) go through the model once and their KV cache is copied to every row
(:func:`shared_prefix_length`), and only the last position, the one sampled from, goes through the LM head
(``logits_to_keep``). Across calls, :func:`prefill_after_past` starts each row after a past of its own (the cached
prefix of :mod:`dppo_oat.rollout.prefix_cache`), and :func:`merge_prefilled` joins batches prefilled apart into one
that decodes together.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Decoded:
    """The sampled continuation of a batch: ``new_ids [B, T]`` (pad after a row's stop token), ``logprobs [B, T, V]``
    of μ at every step (only when ``keep_logprobs``) and ``action_logprobs [B, T]``."""

    new_ids: torch.Tensor
    action_logprobs: torch.Tensor
    logprobs: torch.Tensor | None
    cache: object = None
    """The KV cache at the end: the prompts' columns, then one column per fed token (``fed`` of them)."""
    fed: int = 0


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (pads get 1, as ``generate`` does)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 1)


MIN_SHARED_PREFIX = 2
"""A common prefix shorter than this is prefilled with each row (a separate forward would cost more than it saves)."""


def shared_prefix_length(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_PREFIX) -> int:
    """The number of leading tokens all ``prompts`` share, leaving each at least one token of its own (its last
    position's logits come from the row's own prefill); 0 when that is under ``minimum`` or there is one prompt."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(prompt) for prompt in prompts) - 1
    length = 0
    while length < limit and all(prompt[length] == first[length] for prompt in prompts):
        length += 1
    return length if length >= minimum else 0


def shares_prefixes(model) -> bool:
    """Whether a shared prefix may be cached for ``model``: every layer attends to the whole past (a sliding window
    or attention chunks would count the padding between the prefix and a row's own tokens as positions) and its
    cache is a plain ``DynamicCache`` whose rows can be repeated (checked on a two-token forward)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        full_attention = all(kind == "full_attention" for kind in layer_types)
    else:
        full_attention = getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window",
                                                                                   True) is False
    if not full_attention or getattr(config, "attention_chunk_size", None):
        return False
    device = next(model.parameters()).device
    with torch.inference_mode():
        cache = model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device), use_cache=True).past_key_values
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def last_logits_only(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it: the LM head on the last position only."""
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(model)) else {}


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(model_class: type) -> bool:
    """Whether ``model_class.forward`` has a ``logits_to_keep`` argument (read once per class, off the hot path)."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def inverse_cdf_sample(logprobs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logprobs [B, V]``, drawn from ``exp(logprobs)`` by inverting its cumulative sum at a
    uniform draw: the first token whose cumulative probability exceeds ``u`` (a token of probability 0 never is).
    The same distribution as ``torch.multinomial``, at a fraction of its cost on a CPU."""
    cumulative = logprobs.exp().cumsum(dim=-1)
    total = cumulative[:, -1:]
    uniform = torch.minimum(torch.rand_like(total) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, uniform, right=True).squeeze(-1)


@dataclass
class Prefilled:
    """The state after a prefill: the last position's ``logits [B, V]``, the KV ``cache``, the ``attention_mask`` it
    covers and each row's ``next_position [B, 1]``."""

    logits: torch.Tensor
    cache: object
    attention_mask: torch.Tensor
    next_position: torch.Tensor


def prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            prefix_ids: torch.Tensor | None = None) -> Prefilled:
    """Run the prompts (``prefix_ids`` [P] shared by every row, then each row's left-padded rest) through the model.
    The shared prefix is one forward of batch 1 whose cache is repeated over the rows; the rows' padding then sits
    between the prefix and their own tokens, masked, and positions continue from P."""
    keep = last_logits_only(model)
    prefix_length = 0 if prefix_ids is None else int(prefix_ids.numel())
    cache = None
    if prefix_length:
        cache = model(input_ids=prefix_ids.view(1, -1), use_cache=True, **keep).past_key_values
        cache.batch_repeat_interleave(input_ids.shape[0])
        attention_mask_all = torch.cat([attention_mask.new_ones((input_ids.shape[0], prefix_length)), attention_mask],
                                       dim=-1)
    else:
        attention_mask_all = attention_mask
    positions = prefix_length + left_padded_positions(attention_mask)
    output = model(input_ids=input_ids, attention_mask=attention_mask_all, position_ids=positions,
                   past_key_values=cache, use_cache=True, **keep)
    return Prefilled(output.logits[:, -1], output.past_key_values, attention_mask_all, positions[:, -1:] + 1)


def prefill_after_past(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, past, past_mask: torch.Tensor,
                       past_lengths: torch.Tensor) -> Prefilled:
    """Run each row's left-padded rest ``input_ids`` through the model after a past of its own: per layer
    ``(keys, values)`` of ``[B, H, R, D]`` holding ``past_lengths[b]`` tokens right-aligned (``past_mask [B, R]``).
    The rest's positions continue from ``past_lengths``, so a row is computed as if prefilled whole."""
    from transformers.cache_utils import DynamicCache

    cache = None
    if past_mask.shape[1]:
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(past):
            cache.update(keys, values, layer)
    attention = torch.cat([past_mask, attention_mask], dim=-1)
    positions = past_lengths[:, None] + left_padded_positions(attention_mask)
    output = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                   use_cache=True, **last_logits_only(model))
    return Prefilled(output.logits[:, -1], output.past_key_values, attention, positions[:, -1:] + 1)


def rows_right_aligned(tensors: Sequence[torch.Tensor], rows: Sequence[Sequence[int]],
                       dim: int | None) -> torch.Tensor:
    """One tensor from batches: tensor ``p``'s rows go to rows ``rows[p]`` of the result, and along ``dim`` (if any)
    each is right-aligned in the widest, zeros on its left (masked columns of a left-padded batch)."""
    shape = list(tensors[0].shape)
    shape[0] = sum(len(part_rows) for part_rows in rows)
    if dim is not None:
        shape[dim] = max(tensor.shape[dim] for tensor in tensors)
    out = tensors[0].new_zeros(shape)
    for tensor, part_rows in zip(tensors, rows):
        index = torch.as_tensor(list(part_rows), device=out.device)
        place = out if dim is None else out.narrow(dim, shape[dim] - tensor.shape[dim], tensor.shape[dim])
        place[index] = tensor
    return out


def merge_prefilled(parts: Sequence[Prefilled], rows: Sequence[Sequence[int]]) -> Prefilled:
    """One batch from batches prefilled apart: part ``p`` holds rows ``rows[p]`` of the result. Narrower parts are
    padded on the left with masked columns."""
    from transformers.cache_utils import DynamicCache

    def joined(tensors: Sequence[torch.Tensor], dim: int | None) -> torch.Tensor:
        return rows_right_aligned(tensors, rows, dim)

    cache = DynamicCache()
    for layer in range(len(parts[0].cache.layers)):
        cache.update(joined([part.cache.layers[layer].keys for part in parts], 2),
                     joined([part.cache.layers[layer].values for part in parts], 2), layer)
    return Prefilled(joined([part.logits for part in parts], None), cache,
                     joined([part.attention_mask for part in parts], 1),
                     joined([part.next_position for part in parts], None))


@torch.inference_mode()
def sample_with_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                      temperature: float, stop_ids: torch.Tensor, pad_id: int, keep_logprobs: bool,
                      prefix_ids: torch.Tensor | None = None) -> Decoded:
    """Sample up to ``max_new_tokens`` tokens per row from ``softmax(logits / temperature)``; a row stops after its
    first token in ``stop_ids``. Each row's prompt is ``prefix_ids`` (shared, optional) followed by its row of the
    left-padded ``input_ids``. The caller seeds torch's RNG."""
    return decode(model, prefill(model, input_ids, attention_mask, prefix_ids), max_new_tokens=max_new_tokens,
                  temperature=temperature, stop_ids=stop_ids, pad_id=pad_id, keep_logprobs=keep_logprobs)


@torch.inference_mode()
def decode(model, state: Prefilled, *, max_new_tokens: int, temperature: float, stop_ids: torch.Tensor, pad_id: int,
           keep_logprobs: bool) -> Decoded:
    """Sample from a prefilled batch, one forward per token on the cache (see :func:`sample_with_cache`)."""
    if not temperature > 0:
        raise ValueError(f"the sampling loop needs a temperature > 0, got {temperature}")
    cache, logits, attention_mask, next_position = state.cache, state.logits, state.attention_mask, state.next_position
    fed = 0
    stopped = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens, action_logprobs, all_logprobs = [], [], []
    for step in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = inverse_cdf_sample(logprobs)
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
        cache, logits, next_position, fed = output.past_key_values, output.logits[:, -1], next_position + 1, fed + 1
    return Decoded(torch.stack(tokens, dim=1), torch.stack(action_logprobs, dim=1),
                   torch.stack(all_logprobs, dim=1) if keep_logprobs else None, cache, fed)
