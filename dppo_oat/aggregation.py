"""Loss aggregation: how per-token losses ``[B, T]`` become one scalar.

The modes follow verl's ``agg_loss`` names; ``seq-mean-token-sum-norm`` is Dr.GRPO's (Liu et al., 2025) and oat's
default (``critic_type="drgrpo"``): sum over tokens divided by a constant (the max generation length), then a mean
over sequences, so that no length bias enters the gradient.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_mask(loss: torch.Tensor, mask: torch.Tensor) -> None:
    """``mask`` is a ``[B, T]`` mask of ``loss [B, T]``: the same shape, and boolean or only 0s and 1s (a non-boolean
    mask's values are read on the host: the engines pass booleans, which need no look)."""
    if loss.dim() != 2 or tuple(mask.shape) != tuple(loss.shape):
        raise ValueError(f"aggregate_loss takes a loss [B, T] and a mask of the same shape, got the loss "
                         f"{list(loss.shape)} and the mask {list(mask.shape)}")
    if mask.dtype != torch.bool and ((mask != 0) & (mask != 1)).any():
        odd = mask[(mask != 0) & (mask != 1)].flatten()[0].item()
        raise ValueError(f"aggregate_loss: the mask holds {odd!r}: a mask is boolean or 0/1 (its values would weigh "
                         "the tokens), pass mask.bool() or weigh the loss itself")


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_constant: float | None = None):
    """Reduce ``loss [B, T]`` over the True entries of ``mask [B, T]``.

    - ``token-mean``: Σ loss / Σ mask (every token weighs the same).
    - ``seq-mean-token-sum``: mean over sequences of Σ_t loss.
    - ``seq-mean-token-mean``: mean over sequences of the per-sequence token mean (GRPO's original).
    - ``seq-mean-token-sum-norm``: mean over sequences of Σ_t loss / ``norm_constant`` (Dr.GRPO).

    Sequences without any True token are left out of sequence means. A mask of another shape than the loss, or one
    holding values other than 0 and 1 (a mask of 2s would weigh its tokens twice), is a ``ValueError``
    (:func:`check_mask`).
    """
    check_mask(loss, mask)
    mask = mask.to(loss.dtype)
    loss = loss * mask
    if mode == "token-mean":
        return loss.sum() / mask.sum().clamp(min=1)
    tokens_per_seq = mask.sum(-1)
    seq_present = (tokens_per_seq > 0).to(loss.dtype)
    if mode == "seq-mean-token-sum":
        per_seq = loss.sum(-1)
    elif mode == "seq-mean-token-mean":
        per_seq = loss.sum(-1) / tokens_per_seq.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        if norm_constant is None or not norm_constant > 0:
            raise ValueError(f"{mode} needs norm_constant > 0 (e.g. the max generation length), got {norm_constant}")
        per_seq = loss.sum(-1) / norm_constant
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of: {', '.join(AGGREGATIONS)}")
    return (per_seq * seq_present).sum() / seq_present.sum().clamp(min=1)
