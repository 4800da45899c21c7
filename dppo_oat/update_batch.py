"""The hand-off from rollout to update, shared by the local and oat engines: per-turn samples → the padded learner
batch.

A rollout (:mod:`dppo_oat.rollout`) produces :class:`TurnSample` s: one turn of one episode, with the behavior
policy μ's log-probs of the sampled tokens and, for the top-K rules, μ's top-K set (sec:method_topk). The update
(:mod:`dppo_oat.learner.update`) consumes an :class:`UpdateBatch`. :func:`build_update_batch` turns the first into the
second; the oat engine rebuilds the same samples from oat's transition batches and calls it too, so the two engines
learn from the very same tensors. (A step's sample of tokens for ``tokens.jsonl`` is another thing:
:mod:`dppo_oat.run.token_samples`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol

import numpy as np
import torch

TOPK_PAD_ID = -1
"""Token id of an unused top-K slot (the K+1-th slot is used only when a_t is outside TopK(μ, K))."""
HOST = torch.device("cpu")
"""Where a batch is laid out from the samples' Python lists, whatever the default device: the engine then moves it
to its own device in one copy per field (:meth:`UpdateBatch.to`)."""


@dataclass
class TurnSample:
    """One turn of one episode: the learner's unit of data.

    ``topk_ids``/``topk_logprobs`` are ``[len(response_ids), K+1]`` arrays of the paper's set ``TopK(μ, K) ∪ {a_t}``
    (K best under μ, then a_t or :data:`TOPK_PAD_ID`), ``None`` unless a top-K rule is trained.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: list[float]
    reward: float
    done: bool
    truncated: bool
    turn: int
    env_id: str
    episode_id: int
    group_id: str
    finish_reason: str
    response_text: str = ""
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None
    weights_version: int | None = None
    """The learner step whose weights sampled it (with ``--max-staleness``; None: the latest weights)."""


class LearnerSample(Protocol):
    """What :func:`build_update_batch` reads of a sample (a :class:`TurnSample`, or the oat engine's rows)."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behavior_logprobs: Sequence[float]
    topk_ids: np.ndarray | None
    topk_logprobs: np.ndarray | None


@dataclass
class UpdateBatch:
    """Padded learner batch. ``input_ids [N, L]`` is prompt + response (right-padded); every per-token field is
    ``[N, L−1]``, aligned with the *predicted* tokens ``input_ids[:, 1:]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    behavior_logp: torch.Tensor
    advantages: torch.Tensor
    recomputed_logp: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_behavior_logp: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor) -> UpdateBatch:
        """Rows ``index`` of every field, trimmed to the longest sequence among them (``index`` is copied to the
        batch's device once, not once per field)."""
        index = index.to(self.input_ids.device)
        length = int(self.attention_mask[index].sum(-1).max().item()) if len(index) else 1
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                picked[f.name] = None
            elif f.name in ("input_ids", "attention_mask"):
                picked[f.name] = value[index, :length]
            else:
                picked[f.name] = value[index, : max(length - 1, 1)]
        return UpdateBatch(**picked)

    def to(self, device) -> UpdateBatch:
        return replace(self, **{f.name: _to(getattr(self, f.name), device) for f in fields(self)})

    @property
    def topk_valid(self) -> torch.Tensor | None:
        """Which top-K slots hold a token (``[N, L−1, K+1]``), or None without a top-K set."""
        return None if self.topk_ids is None else self.topk_ids != TOPK_PAD_ID


def _to(value, device):
    return None if value is None else value.to(device)


def build_update_batch(
    samples: Sequence[LearnerSample], advantages: Sequence[float], pad_token_id: int, *, with_topk: bool = False
) -> UpdateBatch:
    """Right-padded ``prompt + response`` ids with μ's log-probs (and top-K) placed at the response positions.

    Position ``t`` of every per-token field describes the token ``input_ids[:, t + 1]``, so a response starting at
    index ``p`` (the prompt length) fills positions ``p − 1 … p + r − 2``. Advantages are per sequence, ``[N, 1]``.
    The batch is on the host (:data:`HOST`).
    """
    if len(samples) != len(advantages):
        raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
    if not samples:
        raise ValueError("no samples to learn from")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    n, width = len(samples), max(lengths)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long, device=HOST)
    attention_mask = torch.zeros((n, width), dtype=torch.long, device=HOST)
    response_mask = torch.zeros((n, width - 1), dtype=torch.bool, device=HOST)
    behavior_logp = torch.zeros((n, width - 1), dtype=torch.float32, device=HOST)
    for row, sample in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        input_ids[row, : p + r] = torch.tensor(list(sample.prompt_ids) + list(sample.response_ids), device=HOST)
        attention_mask[row, : p + r] = 1
        response_mask[row, p - 1 : p + r - 1] = True
        behavior_logp[row, p - 1 : p + r - 1] = torch.tensor(sample.behavior_logprobs, dtype=torch.float32,
                                                             device=HOST)
    batch = UpdateBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        behavior_logp=behavior_logp,
        advantages=torch.from_numpy(np.asarray(advantages, dtype=np.float32)).reshape(n, 1),
    )
    if with_topk:
        batch.topk_ids, batch.topk_behavior_logp = _padded_topk(samples, width - 1)
    return batch


def _padded_topk(samples: Sequence[LearnerSample], positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, L−1, K+1]`` top-K ids (``TOPK_PAD_ID`` off the response) and μ's log-probs on them."""
    if any(s.topk_ids is None for s in samples):
        raise ValueError("a top-K rule needs every sample's top-K set: sample with top_k_logprobs=K")
    width = max(s.topk_ids.shape[1] for s in samples)
    ids = torch.full((len(samples), positions, width), TOPK_PAD_ID, dtype=torch.long, device=HOST)
    logps = torch.full((len(samples), positions, width), float("-inf"), dtype=torch.float32, device=HOST)
    for row, sample in enumerate(samples):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        k = sample.topk_ids.shape[1]
        ids[row, p - 1 : p + r - 1, :k] = torch.as_tensor(sample.topk_ids, dtype=torch.long, device=HOST)
        logps[row, p - 1 : p + r - 1, :k] = torch.as_tensor(sample.topk_logprobs, dtype=torch.float32, device=HOST)
    return ids, logps
