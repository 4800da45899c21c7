"""Masked reductions of ``[B, T]`` tensors: over the tokens a boolean mask selects (a batch statistic), or along each
row (a row of the loss is one response, one turn: the sequence of the sequence-level rules).

Each gives 0 where its mask selects nothing, so an empty batch or row yields no NaN.
"""

from __future__ import annotations

import math

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` holds (0 where it holds nowhere)."""
    mask = mask.bool()
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def masked_std(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The standard deviation of ``values`` where ``mask`` holds, with Bessel's correction (torch's ``std``, as SkyRL
    takes it); 0 for fewer than two values."""
    count = mask.sum()
    centred = torch.where(mask, values - masked_mean(values, mask), 0.0)
    variance = centred.square().sum() / (count - 1).clamp(min=1)
    return torch.where(count > 1, variance.sqrt(), 0.0)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The largest of ``values`` where ``mask`` holds (0 where it holds nowhere)."""
    largest = torch.where(mask, values, -math.inf).max()
    return torch.where(torch.isfinite(largest), largest, 0.0)


def fraction(event: torch.Tensor, population: torch.Tensor) -> torch.Tensor:
    """The share of ``population`` where ``event`` holds (0 for an empty population)."""
    count = population.sum()
    return (event & population).sum() / count.clamp(min=1)


def row_sum(values: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: the sum of ``values`` over each row's response tokens (0 for a row without any)."""
    return torch.where(response, values, 0.0).sum(-1, keepdim=True)


def row_mean(values: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: the mean of ``values`` over each row's response tokens (0 for a row without any). Of a log ratio, the
    log of its geometric mean."""
    return row_sum(values, response) / response.sum(-1, keepdim=True).clamp(min=1)


def row_max(values: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: the max of ``values`` over each row's response tokens (0 for a row without any), as verl's
    ``_sequence_max``."""
    largest = torch.where(response, values, -math.inf).amax(-1, keepdim=True)
    return torch.where(torch.isneginf(largest), 0.0, largest)


def sum_before(values: torch.Tensor) -> torch.Tensor:
    """``Σ_{j<t} values_j`` along the last dimension (0 at t = 1)."""
    return torch.cat([torch.zeros_like(values[..., :1]), values.cumsum(-1)[..., :-1]], -1)
