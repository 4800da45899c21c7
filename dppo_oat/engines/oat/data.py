"""oat's transition data ⇄ the core's samples and :class:`~dppo_oat.update_batch.UpdateBatch`.

The actor turns each of the core's :class:`~dppo_oat.update_batch.TurnSample` into a :class:`DPPOTransitionData`:
oat's ``TransitionData`` (prompt and response ids, μ's log-probs, rewards) plus the sample's advantage and μ's top-K
set as NumPy arrays. oat pickles these between processes as they are. On the learner, :class:`DPPOTransitionDataset`
keeps the extra fields through oat's collation, and :func:`update_batch_from_trajectory` rebuilds the samples from
oat's padded batch and pads them with the core's :func:`~dppo_oat.update_batch.build_update_batch`, so the learner's
batch is exactly the one the local engine builds from the same samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from oat.types import TransitionData
from oat.utils.data import TransitionDataset

from dppo_oat.update_batch import TurnSample, UpdateBatch, build_update_batch

DPPO_FIELDS = ("advantage", "turn", "topk_ids", "topk_logprobs", "weight_version")
"""What :class:`DPPOTransitionData` adds to oat's transition, carried through the learner's collation."""


@dataclass
class DPPOTransitionData(TransitionData):
    """One turn of one episode, as oat moves it from actor to learner (``turn``: its index in the episode).

    ``topk_ids``/``topk_logprobs`` are ``[len(response_ids), K+1]`` arrays of the paper's set ``TopK(μ, K) ∪ {a_t}``
    (see :class:`dppo_oat.update_batch.TurnSample`), ``None`` unless a top-K rule is trained. ``weight_version``: how
    many of the learner's weight broadcasts the actor had loaded when it sampled the turn (0: ``--pretrain``'s
    weights).
    """

    advantage: float = 0.0
    turn: int = 0
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None
    weight_version: int = 0


def transition_from_sample(
    sample: TurnSample, advantage: float, prompt_text: str, info: dict, *, ignore_no_eos: bool = False,
    weight_version: int = 0,
) -> DPPOTransitionData:
    """oat's view of a core sample: the turn's reward on its last token (oat's dense-reward convention), sampled
    with the actor's ``weight_version``.

    ``ignore_no_eos`` (oat's flag): a response cut at the length limit is kept out of the loss (``loss_mask``);
    either way the env received it as an invalid action.
    """
    rewards = [0.0] * max(len(sample.response_ids) - 1, 0) + [float(sample.reward)]
    return DPPOTransitionData(
        prompt=prompt_text,
        prompt_ids=list(sample.prompt_ids),
        response=sample.response_text,
        response_ids=list(sample.response_ids),
        response_logprobs=list(sample.behavior_logprobs),
        rewards=rewards,
        loss_mask=not (ignore_no_eos and sample.finish_reason == "length"),
        info=dict(info),
        advantage=float(advantage),
        turn=int(sample.turn),
        topk_ids=sample.topk_ids,
        topk_logprobs=sample.topk_logprobs,
        weight_version=int(weight_version),
    )


class DPPOTransitionDataset(TransitionDataset):
    """oat's transition dataset, also collating :data:`DPPO_FIELDS` (one list entry per transition)."""

    def __init__(self, buffer: Sequence[DPPOTransitionData], tokenizer, strategy, **kwargs) -> None:
        super().__init__(buffer, tokenizer, strategy, **kwargs)
        for transition, data in zip(self.transitions, buffer, strict=True):
            transition.update({name: getattr(data, name) for name in DPPO_FIELDS})

    def collate_fn(self, item_list):
        batch = super().collate_fn(item_list)
        batch.update({name: [item[name] for item in item_list] for name in DPPO_FIELDS})
        return batch


@dataclass
class LearnerRow:
    """A :class:`~dppo_oat.update_batch.LearnerSample`: what :func:`~dppo_oat.update_batch.build_update_batch` reads."""

    prompt_ids: list
    response_ids: list
    behavior_logprobs: list
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None


def rows_from_trajectory(trajectory: dict) -> list[LearnerRow]:
    """Undo oat's right padding: each row's prompt and response ids with μ's log-probs and top-K set."""
    input_ids = trajectory["input_ids"].cpu()
    lengths = trajectory["attention_mask"].cpu().sum(-1).long().tolist()
    rows = []
    for i, (length, prompt_length) in enumerate(zip(lengths, trajectory["prompt_ids_lens"], strict=True)):
        rows.append(
            LearnerRow(
                prompt_ids=input_ids[i, :prompt_length].tolist(),
                response_ids=input_ids[i, prompt_length:length].tolist(),
                behavior_logprobs=list(trajectory["action_logprobs"][i]),
                topk_ids=trajectory["topk_ids"][i],
                topk_logprobs=trajectory["topk_logprobs"][i],
            )
        )
    return rows


def update_batch_from_trajectory(trajectory: dict, pad_token_id: int, *, with_topk: bool) -> UpdateBatch:
    """The core's batch of one oat trajectory batch (collated by :class:`DPPOTransitionDataset`).

    Transitions with ``loss_mask=False`` (oat's ``ignore_no_eos``) keep no response token.
    """
    rows = rows_from_trajectory(trajectory)
    batch = build_update_batch(rows, trajectory["advantage"], pad_token_id, with_topk=with_topk)
    keep = torch.as_tensor(trajectory["loss_masks"], dtype=torch.bool).reshape(-1, 1)
    batch.response_mask &= keep
    return batch
