"""Prefix caching across generator calls: a turn's prompt reuses the KV cache of the previous turn's rows.

A multi-turn rollout calls the generator once per turn, and a turn's prompt repeats much of the one before: a
chat-history prompt is the last prompt and response plus a new observation; a compact game board changes in one
cell, or not at all after a wrong move. As vLLM's automatic prefix caching does on blocks, the HF generator keeps
the keys and values of its last call's rows (prompt and fed response tokens) and prefills a new prompt from the end
of its longest cached prefix:

- :class:`PrefixCache` finds, for each prompt, the cached row sharing its longest prefix (every prompt against every
  row at once);
- :func:`gather_past` copies those keys and values into a left-padded past of a batch;
- :func:`length_buckets` splits a batch by the length still to prefill, so that a few long suffixes do not pad every
  row to their length; the buckets fill consecutive rows of one buffer and decode together.

A key or value of a causal model depends only on the tokens up to it, their positions and the weights, so a
reused prefix is what a full prefill computes (up to float rounding of another batch shape). The cache is keyed on
the weights' storage and version counters (:func:`weights_version`: an optimizer step, ``load_state_dict`` or a
tensor swapped in changes them): rows cached under other weights are never reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dppo_oat.rollout.direct_forward import KVBuffer

MIN_REUSE = 2
"""A cached prefix shorter than this is prefilled again (gathering it would cost more than it saves)."""
SPLIT_SAVING = 0.1
"""A batch is prefilled in one length bucket more when that spares at least this share of its padded suffix tokens
(padded to its longest row in one bucket)."""
MAX_BUCKETS = 3
"""The most length buckets a batch is prefilled in."""


@dataclass
class CachedRows:
    """Keys and values of the rows of one call, where the call left them: in layer ``l``, row ``n``'s tokens are the
    columns ``columns[n, -lengths[n]:]`` of ``keys[l][n]`` (``[N, H, W, D]``), in order, at positions 0, 1, …
    (``columns [N, C]`` lists each row's columns right-aligned; a row's padding and unfed tokens are skipped)."""

    tokens: list[tuple[int, ...]]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    columns: torch.Tensor


WeightsVersion = tuple[tuple[int, int], ...]
"""What :func:`weights_version` returns: (storage address, version counter) per parameter."""


def weights_version(model) -> WeightsVersion:
    """Each parameter's storage address and version counter: an in-place change through the parameter (an optimizer
    step, ``load_state_dict``, :meth:`HFGenerator.update_weights`) or a tensor swapped in (``load_state_dict(...,
    assign=True)``, ``p.data = ...``) changes this tuple. A write through ``p.data`` into the same storage bumps no
    counter: code that writes weights that way must call ``forget_prefixes()`` after it."""
    return tuple((parameter.data_ptr(), parameter._version) for parameter in model.parameters())


class PrefixCache:
    """The last call's rows, found by prefix: :meth:`lookup_all` gives, for each prompt, the cached row sharing its
    longest prefix and that prefix's length (leaving the prompt at least its last token to prefill), compared at
    once against every row (``[prompts, rows, tokens]`` in numpy)."""

    def __init__(self) -> None:
        self.rows: CachedRows | None = None
        self._tokens = np.zeros((0, 0), dtype=np.int64)
        self._version: WeightsVersion | None = None

    def store(self, rows: CachedRows, version: WeightsVersion) -> None:
        """Replace the cache by ``rows``, computed under the weights of ``version``."""
        self.rows, self._version = rows, version
        self._tokens = np.full((len(rows.tokens), max(map(len, rows.tokens), default=0)), -1, dtype=np.int64)
        for index, tokens in enumerate(rows.tokens):
            self._tokens[index, : len(tokens)] = tokens

    def clear(self) -> None:
        self.rows, self._tokens, self._version = None, np.zeros((0, 0), dtype=np.int64), None

    def lookup_all(self, prompts: Sequence[Sequence[int]], version: WeightsVersion) -> list[tuple[int, int]]:
        """Per prompt ``(row, length)``: the first cached row sharing the longest prefix with it and that prefix's
        length, at most ``len(prompt) - 1``; ``(-1, 0)`` when it is under :data:`MIN_REUSE` or the weights
        changed."""
        width = min(self._tokens.shape[1], max((len(prompt) for prompt in prompts), default=1) - 1)
        if version != self._version or self.rows is None or width < MIN_REUSE:
            return [(-1, 0)] * len(prompts)
        queries = np.full((len(prompts), width), -2, dtype=np.int64)  # -2: no token (cached rows pad with -1)
        for index, prompt in enumerate(prompts):
            head = prompt[: min(len(prompt) - 1, width)]
            queries[index, : len(head)] = head
        same = queries[:, None, :] == self._tokens[None, :, :width]  # [prompts, rows, width]
        shared = np.where(same.all(axis=2), width, np.argmin(same, axis=2))  # length of the common prefix
        best = shared.argmax(axis=1)
        lengths = shared[np.arange(len(prompts)), best]
        return [(int(row), int(length)) if length >= MIN_REUSE else (-1, 0)
                for row, length in zip(best, lengths, strict=True)]

    def lookup(self, prompt: Sequence[int], version: WeightsVersion) -> tuple[int, int]:
        """:meth:`lookup_all` for one prompt."""
        return self.lookup_all([prompt], version)[0]


def gather_past(rows: CachedRows, sources: torch.Tensor, reuse: torch.Tensor):
    """The past of a batch whose row ``j`` reuses the first ``reuse[j]`` tokens of cached row ``sources[j]``:
    per layer ``(keys, values)`` of ``[B, H, R, D]`` (``R = max(reuse)``, rows right-aligned) and the past's
    attention mask ``[B, R]``, on the cache's device. Rows reusing nothing (``reuse[j] == 0``) get an all-masked
    past."""
    width = int(reuse.max())
    columns = torch.arange(width, device=reuse.device)
    mask = (columns[None, :] >= (width - reuse)[:, None]).long()
    source_rows = sources.clamp(min=0)  # a row reusing nothing reads row 0, all masked
    lengths = rows.lengths.to(reuse.device)[source_rows]
    listed = rows.columns.shape[1]
    index = (listed - lengths[:, None] + columns[None, :] - (width - reuse)[:, None]).clamp(0, listed - 1)
    device = rows.keys[0].device
    source_rows = source_rows[:, None].to(device)
    index = rows.columns.to(device)[source_rows, index.to(device)]  # the cached tokens' columns in the keys
    past = [(keys[source_rows, :, index].transpose(1, 2), values[source_rows, :, index].transpose(1, 2))
            for keys, values in zip(rows.keys, rows.values, strict=True)]  # [B, R, H, D] -> [B, H, R, D]
    return past, mask.to(device)


def pack_rows(cache: KVBuffer, valid: torch.Tensor, tokens: list[tuple[int, ...]]) -> CachedRows:
    """The rows of ``cache`` (its filled columns, not copied: the buffer is the call's own and is not written
    again) whose tokens ``valid [B, W]`` marks, listed in order."""
    lengths = valid.sum(dim=1)
    width = int(lengths.max())
    columns = torch.sort(valid.int(), dim=1, stable=True).indices[:, -width:]  # invalid first, valid in order last
    filled = cache.filled()
    return CachedRows(tokens, [keys for keys, _ in filled], [values for _, values in filled], lengths.cpu(),
                      columns.cpu())


def rows_right_aligned(tensors: Sequence[torch.Tensor], rows: Sequence[Sequence[int]], dim: int) -> torch.Tensor:
    """One tensor from batches: tensor ``p``'s rows go to rows ``rows[p]`` of the result, and along ``dim`` each is
    right-aligned in the widest, zeros on its left (masked columns of a left-padded batch)."""
    shape = list(tensors[0].shape)
    shape[0] = sum(len(part_rows) for part_rows in rows)
    shape[dim] = max(tensor.shape[dim] for tensor in tensors)
    out = tensors[0].new_zeros(shape)
    for tensor, part_rows in zip(tensors, rows, strict=True):
        index = torch.as_tensor(list(part_rows), device=out.device)
        out.narrow(dim, shape[dim] - tensor.shape[dim], tensor.shape[dim])[index] = tensor
    return out


def concat_rows(parts: Sequence[CachedRows]) -> CachedRows:
    """The rows of several batches as one (narrower batches padded on the left, their columns shifted with them)."""
    if len(parts) == 1:
        return parts[0]
    starts = np.cumsum([0] + [len(part.tokens) for part in parts])
    rows = [range(start, start + len(part.tokens)) for start, part in zip(starts, parts, strict=False)]

    def joined(tensors: Sequence[torch.Tensor], dim: int = 2) -> torch.Tensor:
        return rows_right_aligned(tensors, rows, dim=dim)

    width = max(part.keys[0].shape[2] for part in parts)
    layers = range(len(parts[0].keys))
    return CachedRows([tokens for part in parts for tokens in part.tokens],
                      [joined([part.keys[layer] for part in parts]) for layer in layers],
                      [joined([part.values[layer] for part in parts]) for layer in layers],
                      torch.cat([part.lengths for part in parts]),
                      joined([part.columns + (width - part.keys[0].shape[2]) for part in parts], dim=1))


def padded_costs(lengths: Sequence[int], max_buckets: int) -> list[tuple[int, list[int]]]:
    """For ``k = 1 … max_buckets``: the fewest padded tokens of the sorted ``lengths`` cut into ``k`` consecutive
    buckets, each padded to its longest (cuts fall between distinct lengths), and the bucket ends (indices into
    the sorted lengths)."""
    distinct, counts = np.unique(np.asarray(lengths), return_counts=True)
    values, ends = distinct.tolist(), np.cumsum(counts).tolist()
    best = [(ends[j] * values[j], [ends[j]]) for j in range(len(values))]  # one bucket over values[: j + 1]
    costs = [best[-1]]
    for _ in range(1, max_buckets):
        best = [min(((best[i][0] + (ends[j] - ends[i]) * values[j], best[i][1] + [ends[j]]) for i in range(j)),
                    default=best[j]) for j in range(len(values))]
        costs.append(best[-1])
    return costs


def length_buckets(suffix_lengths: Sequence[int], min_saving: float = SPLIT_SAVING,
                   max_buckets: int = MAX_BUCKETS) -> list[list[int]]:
    """Row indices in up to ``max_buckets`` buckets by the number of tokens each row still prefills: each bucket
    more is taken only when it spares at least ``min_saving`` of the padded tokens of one bucket (a forward more
    costs its own overhead)."""
    order = sorted(range(len(suffix_lengths)), key=lambda i: suffix_lengths[i])
    costs = padded_costs(suffix_lengths, max_buckets)
    chosen = 0
    while chosen + 1 < len(costs) and costs[chosen][0] - costs[chosen + 1][0] >= min_saving * costs[0][0]:
        chosen += 1
    starts = [0] + costs[chosen][1][:-1]
    return [sorted(order[start:end]) for start, end in zip(starts, costs[chosen][1], strict=True)]
