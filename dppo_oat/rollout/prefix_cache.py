"""Prefix caching across generator calls: a turn's prompt reuses the KV cache of the previous turn's rows.

A multi-turn rollout calls the generator once per turn, and a turn's prompt repeats much of the one before: a
chat-history prompt is the last prompt and response plus a new observation; a compact game board changes in one
cell, or not at all after a wrong move. As vLLM's automatic prefix caching does on blocks, the HF generator keeps
the keys and values of its last call's rows (prompt and fed response tokens) and prefills a new prompt from the end
of its longest cached prefix:

- :class:`PrefixCache` finds, for a prompt, the cached row sharing its longest prefix (a token trie);
- :func:`gather_past` copies those keys and values into a left-padded past of a batch;
- :func:`length_buckets` splits a batch by the length still to prefill, so that a few long suffixes do not pad every
  row to their length.

A key or value of a causal model depends only on the tokens up to it, their positions and the weights, so a
reused prefix is what a full prefill computes (up to float rounding of another batch shape). The cache is keyed on
the weights' version counters (every in-place update bumps them: an optimizer step, ``load_state_dict``): rows
cached under other weights are never reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dppo_oat.rollout.decode import rows_right_aligned

MIN_REUSE = 2
"""A cached prefix shorter than this is prefilled again (gathering it would cost more than it saves)."""
SPLIT_SAVING = 0.25
"""A batch is prefilled in two length buckets when that spares at least this share of its padded suffix tokens."""


@dataclass
class CachedRows:
    """Keys and values of the rows of one call, packed to the right: in layer ``l``, row ``n``'s tokens are the last
    ``lengths[n]`` columns of ``keys[l][n]`` (``[N, H, W, D]``), in order, at positions 0, 1, …"""

    tokens: list[tuple[int, ...]]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor


def weights_version(model) -> tuple[int, ...]:
    """The version counters of ``model``'s parameters: any in-place change of a weight changes this tuple."""
    return tuple(parameter._version for parameter in model.parameters())


class PrefixCache:
    """The last call's rows, found by prefix: ``lookup(prompt)`` gives the cached row and the number of leading
    tokens it shares with ``prompt`` (leaving the prompt at least its last token to prefill)."""

    def __init__(self) -> None:
        self.rows: CachedRows | None = None
        self._trie: dict = {}
        self._version: tuple[int, ...] | None = None

    def store(self, rows: CachedRows, version: tuple[int, ...]) -> None:
        """Replace the cache by ``rows``, computed under the weights of ``version``."""
        self.rows, self._version, self._trie = rows, version, {}
        for index, tokens in enumerate(rows.tokens):
            node = self._trie
            for token in tokens:
                node = node.setdefault(token, {})
                node.setdefault(None, index)  # the key None holds the first row through this node

    def clear(self) -> None:
        self.rows, self._trie, self._version = None, {}, None

    def lookup(self, prompt: Sequence[int], version: tuple[int, ...]) -> tuple[int, int]:
        """``(row, length)``: the cached row sharing the longest prefix with ``prompt`` and that prefix's length,
        at most ``len(prompt) - 1``; ``(-1, 0)`` when it is under :data:`MIN_REUSE` or the weights changed."""
        if version != self._version:
            return -1, 0
        node, row, length = self._trie, -1, 0
        for depth, token in enumerate(prompt[: len(prompt) - 1], start=1):
            node = node.get(token)
            if node is None:
                break
            row, length = node[None], depth
        return (row, length) if length >= MIN_REUSE else (-1, 0)


def gather_past(rows: CachedRows, sources: torch.Tensor, reuse: torch.Tensor):
    """The past of a batch whose row ``j`` reuses the first ``reuse[j]`` tokens of cached row ``sources[j]``:
    per layer ``(keys, values)`` of ``[B, H, R, D]`` (``R = max(reuse)``, rows right-aligned) and the past's
    attention mask ``[B, R]``. Rows reusing nothing (``reuse[j] == 0``) get an all-masked past."""
    width = int(reuse.max())
    columns = torch.arange(width, device=reuse.device)
    mask = (columns[None, :] >= (width - reuse)[:, None]).long()
    source_rows = sources.clamp(min=0)  # a row reusing nothing reads row 0, all masked
    lengths = rows.lengths.to(reuse.device)[source_rows]
    packed_width = rows.keys[0].shape[2]
    index = (packed_width - lengths[:, None] + columns[None, :] - (width - reuse)[:, None]).clamp(0, packed_width - 1)
    source_rows, index = source_rows[:, None].to(rows.keys[0].device), index.to(rows.keys[0].device)
    past = [(keys[source_rows, :, index].transpose(1, 2), values[source_rows, :, index].transpose(1, 2))
            for keys, values in zip(rows.keys, rows.values)]  # [B, R, H, D] -> [B, H, R, D]
    return past, mask


def pack_rows(cache, valid: torch.Tensor, tokens: list[tuple[int, ...]]) -> CachedRows:
    """Pack the columns of ``cache`` (a ``DynamicCache`` over ``[B, ·, W, ·]``) that ``valid [B, W]`` marks as each
    row's tokens, in order, to the right of a narrower copy."""
    lengths = valid.sum(dim=1)
    width = int(lengths.max())
    order = torch.sort(valid.int(), dim=1, stable=True).indices[:, -width:]  # invalid first, valid in order last
    keys, values = [], []
    for layer in cache.layers:
        expanded = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        keys.append(layer.keys.gather(2, expanded.to(layer.keys.device)))
        values.append(layer.values.gather(2, expanded.to(layer.values.device)))
    return CachedRows(tokens, keys, values, lengths.cpu())


def concat_rows(parts: Sequence[CachedRows]) -> CachedRows:
    """The rows of several batches as one (narrower batches padded on the left)."""
    if len(parts) == 1:
        return parts[0]
    starts = np.cumsum([0] + [len(part.tokens) for part in parts])
    rows = [range(start, start + len(part.tokens)) for start, part in zip(starts, parts)]

    def joined(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return rows_right_aligned(tensors, rows, dim=2)

    layers = range(len(parts[0].keys))
    return CachedRows([tokens for part in parts for tokens in part.tokens],
                      [joined([part.keys[layer] for part in parts]) for layer in layers],
                      [joined([part.values[layer] for part in parts]) for layer in layers],
                      torch.cat([part.lengths for part in parts]))


def length_buckets(suffix_lengths: Sequence[int], min_saving: float = SPLIT_SAVING) -> list[list[int]]:
    """Row indices in one or two buckets by the number of tokens each row still prefills: two when padding each
    bucket to its own longest row spares at least ``min_saving`` of padding every row to the longest one."""
    order = sorted(range(len(suffix_lengths)), key=lambda i: suffix_lengths[i])
    ordered = [suffix_lengths[i] for i in order]
    whole = len(ordered) * ordered[-1]
    best, split = whole, 0
    for k in range(1, len(ordered)):
        cost = k * ordered[k - 1] + (len(ordered) - k) * ordered[-1]
        if cost < best:
            best, split = cost, k
    if split == 0 or whole - best < min_saving * whole:
        return [list(range(len(suffix_lengths)))]
    return [sorted(order[:split]), sorted(order[split:])]
