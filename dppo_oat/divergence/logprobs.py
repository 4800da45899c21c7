"""Log-probabilities from logits, chunked over tokens.

A full ``[N, V]`` log-softmax of an LLM batch (V = 151,936 for Qwen3) costs gigabytes. Every function here walks the
N token rows in chunks, so the extra memory is O(chunk × V) whatever N is. They work under autograd as well.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_SIZE = 1024


def _row_chunks(num_rows: int, chunk_size: int):
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    for start in range(0, num_rows, chunk_size):
        yield slice(start, min(start + chunk_size, num_rows))


def gather_logprobs_chunked(
    logits: torch.Tensor, ids: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """``log softmax(logits)[..., ids]`` in fp32 without materialising the full log-softmax.

    ``logits`` is ``[..., V]``; ``ids`` is ``[...]`` (one id per row) or ``[..., K]`` (K ids per row, e.g. the
    top-K set of sec:method_topk). Negative ids (padding) give log-prob ``-inf``.
    """
    single = ids.dim() == logits.dim() - 1
    ids_2d = ids.reshape(-1, 1) if single else ids.reshape(-1, ids.shape[-1])
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.shape[0] != ids_2d.shape[0]:
        raise ValueError(f"logits have {rows.shape[0]} rows but ids have {ids_2d.shape[0]}")
    pad = ids_2d < 0
    safe_ids = ids_2d.clamp(min=0)
    pieces = []
    for rows_slice in _row_chunks(rows.shape[0], chunk_size):
        chunk = rows[rows_slice].float()
        picked = chunk.gather(-1, safe_ids[rows_slice]) - torch.logsumexp(chunk, dim=-1, keepdim=True)
        pieces.append(picked)
    out = torch.cat(pieces, dim=0) if pieces else rows.new_zeros((0, ids_2d.shape[1]), dtype=torch.float32)
    out = out.masked_fill(pad, float("-inf"))
    return out.reshape(ids.shape)


def entropy_chunked(logits: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy ``H(softmax(logits))`` per row, fp32, chunked over rows. Returns ``logits.shape[:-1]``."""
    rows = logits.reshape(-1, logits.shape[-1])
    pieces = []
    for rows_slice in _row_chunks(rows.shape[0], chunk_size):
        chunk = rows[rows_slice].float()
        logp = torch.log_softmax(chunk, dim=-1)
        pieces.append(-(logp.exp() * logp).sum(-1))
    out = torch.cat(pieces) if pieces else rows.new_zeros((0,), dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def logits_logprobs(logits: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                    topk_ids: torch.Tensor | None = None, with_entropy: bool = True,
                    chunk_size: int = DEFAULT_CHUNK_SIZE):
    """``(log π(a_t), entropy, log π on topk_ids)`` of ``softmax(logits / temperature)`` (the logits path: under
    autograd every chunk's fp32 copy is kept for backward). Only ``log π(a_t)`` carries gradient; absent parts are
    None. :func:`dppo_oat.learner.fused_head.fused_head_logprobs` computes the same from the hidden states."""
    if temperature != 1.0:  # in fp32 at least: half-precision logits (autocast's) would round again here
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = gather_logprobs_chunked(logits, ids, chunk_size=chunk_size)
    with torch.no_grad():
        entropy = entropy_chunked(logits.detach(), chunk_size=chunk_size) if with_entropy else None
        topk = None if topk_ids is None else gather_logprobs_chunked(logits.detach(), topk_ids, chunk_size=chunk_size)
    return logp, entropy, topk


def topk_of_logprobs(logprobs: torch.Tensor, sampled_ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's set ``TopK(p, K) ∪ {a_t}`` (sec:method_topk) as ``[..., K+1]`` ids and log-probs.

    The last slot holds ``a_t`` when it is outside the top K, else id ``-1`` with log-prob ``-inf``.
    """
    top_logp, top_ids = logprobs.topk(k, dim=-1)
    sampled = sampled_ids.unsqueeze(-1)
    inside = (top_ids == sampled).any(dim=-1, keepdim=True)
    extra_id = torch.where(inside, torch.full_like(sampled, -1), sampled)
    extra_logp = torch.where(inside, torch.full_like(top_logp[..., :1], float("-inf")), logprobs.gather(-1, sampled))
    return torch.cat([top_ids, extra_id], dim=-1), torch.cat([top_logp, extra_logp], dim=-1)
