"""Per-turn samples → the padded :class:`~dppo_oat.update.UpdateBatch` of the learner."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from dppo_oat.rollout.episodes import TurnSample
from dppo_oat.rollout.generation import TOPK_PAD_ID
from dppo_oat.update import UpdateBatch


def build_update_batch(
    samples: Sequence[TurnSample], advantages: Sequence[float], pad_token_id: int, *, with_topk: bool = False
) -> UpdateBatch:
    """Right-padded ``prompt + response`` ids with μ's log-probs (and top-K) placed at the response positions.

    Position ``t`` of every per-token field describes the token ``input_ids[:, t + 1]``, so a response starting at
    index ``p`` (the prompt length) fills positions ``p − 1 … p + r − 2``. Advantages are per sequence, ``[N, 1]``.
    """
    if len(samples) != len(advantages):
        raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
    if not samples:
        raise ValueError("no samples to learn from")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    n, width = len(samples), max(lengths)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    behavior_logp = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, sample in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        input_ids[row, : p + r] = torch.tensor(list(sample.prompt_ids) + list(sample.response_ids))
        attention_mask[row, : p + r] = 1
        response_mask[row, p - 1 : p + r - 1] = True
        behavior_logp[row, p - 1 : p + r - 1] = torch.tensor(sample.behavior_logprobs, dtype=torch.float32)
    batch = UpdateBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        behavior_logp=behavior_logp,
        advantages=torch.tensor(np.asarray(advantages, dtype=np.float32)).reshape(n, 1),
    )
    if with_topk:
        batch.topk_ids, batch.topk_behavior_logp = _padded_topk(samples, width - 1)
    return batch


def _padded_topk(samples: Sequence[TurnSample], positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, L−1, K+1]`` top-K ids (``TOPK_PAD_ID`` off the response) and μ's log-probs on them."""
    if any(s.topk_ids is None for s in samples):
        raise ValueError("a top-K rule needs every sample's top-K set: sample with top_k_logprobs=K")
    width = max(s.topk_ids.shape[1] for s in samples)
    ids = torch.full((len(samples), positions, width), TOPK_PAD_ID, dtype=torch.long)
    logps = torch.full((len(samples), positions, width), float("-inf"), dtype=torch.float32)
    for row, sample in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        k = sample.topk_ids.shape[1]
        ids[row, p - 1 : p + r - 1, :k] = torch.as_tensor(sample.topk_ids, dtype=torch.long)
        logps[row, p - 1 : p + r - 1, :k] = torch.as_tensor(sample.topk_logprobs, dtype=torch.float32)
    return ids, logps
